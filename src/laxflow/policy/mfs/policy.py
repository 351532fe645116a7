"""Multi-stage Flow Scheduling: the ``mfs`` policy.

MFS (the paper's §4) on the engine's policy interface. Every decision:

1. New flows are admitted into the RMLQ (:mod:`laxflow.policy.rmlq`) at their
   entry level: explicit-deadline flows (``p2d`` with a deadline) by MLU
   (:mod:`laxflow.policy.mlu`), all others by RLI
   (:mod:`laxflow.policy.rli`; ``collective`` = RLI 0).
2. Flows whose request crossed a layer boundary since their level was set,
   and explicit-deadline flows of requests whose compute has ended at each
   ``period`` tick, are re-evaluated and can only be promoted.
3. Batches are ranked by RED and Algorithm 1 prunes infeasible requests into
   the scavenger class (:mod:`laxflow.policy.inter_request`), either by the
   coordinator (:meth:`MfsPolicy.set_order`) or, with no coordinator, by the
   policy itself on every batch arrival and departure.
4. Arbitration (:mod:`laxflow.policy.arbitration`) turns levels, RLI and RED
   rank into the engine's strict-priority levels.

Level layout (K = ``levels``, default 8; level 0 is served first):

* RMLQ level 0 — reserved top: explicit-deadline flows with MLU >= U.
* RMLQ level q in 1..K-1 — implicit-deadline flows with min(1 + RLI, K-1) = q
  first (smaller RLI, then RED rank of the batch), then explicit-deadline
  flows at MLU level q (MLU in [U E^-q, U E^-(q-1))).
* RMLQ level K — scavenger: a pruned request's own flows (``reuse`` and
  ``p2d``), served only with capacity nothing else wants; never dropped. A
  ``collective`` flow keeps its level even when the request it is tagged
  with is pruned: it carries the whole batch and blocks every request in it.

Each decision carries every flow's RMLQ level after pruning as ``queue``
(K = scavenger) and its DSCP as ``dscp``, from ``MfsConfig.dscp_map``
(default: 39 - q for K = 8, CS1 for the scavenger; :mod:`laxflow.policy.dscp`).
``level`` is the finer host order of :mod:`laxflow.policy.arbitration`. ``Flow.state['rmlq_level']``
holds each flow's RMLQ level (before any pruning) whenever it changes (unless
``flow_notes`` is False: the owner reads nothing back from the flows).

Infeasible explicit flows (MLU > 1 at their last evaluation) are counted in
``infeasible`` and stay at the top: their bytes still have to arrive.

The state and the decision step live in one object, chosen once at
construction (``native``): the C core (``core.c``, class ``Core`` in
``laxflow.policy.mfs._core``) when it is built, else
:class:`~laxflow.policy.mfs.reference.Reference` (Python and NumPy). Both
give bit-identical decisions; the tests hold the core to the reference.
This wrapper keeps what both share: the coordinator's order, RED ranking
and Algorithm 1's pruning (called back by the state when the order is
stale), the infeasible set and the notes on the flows.

Called by the network engine (``decide`` on an incremental snapshot, at
every event: ``keeps_tags``; ``on_complete`` per finished flow), by the node
daemon with the same objects, and by the coordinator's glue through
``set_order``. One instance per network, on its owner's one thread.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.config import MfsConfig
from laxflow.policy.dscp import DscpMap
from laxflow.policy.flow import Flow, Stage
from laxflow.policy.inter_request import LoadTableBuilder, schedule_table
from laxflow.policy.mfs.reference import Reference
from laxflow.policy.mlu import thresholds
from laxflow.policy.red import red_order, robust_effective_deadline

try:  # the C core (core.c); not built: the reference
    from laxflow.policy.mfs._core import Core
except ImportError:
    Core = None

NATIVE = Core is not None  # whether the C core is built


class MfsPolicy(FlowPolicy):
    """RMLQ with MLU/RLI promotion, RED order, pruning into a scavenger class."""

    name = "mfs"
    keeps_tags = True  # its RMLQ slots ride in Snapshot.tag / Decision.tag (the network engine)

    def __init__(self, config: MfsConfig | None = None, *, native: bool | None = None, **options: Any) -> None:
        """``native``: the C core (None: when built; True without it: the reference too)."""
        self.config = config if config is not None else MfsConfig.from_mapping(options)
        self._native = NATIVE and native is not False
        state, c = Core if self._native else Reference, self.config
        self.state = state(c.levels, c.period, c.load_window, c.drop_budget > 0, thresholds(c.levels, c.E, c.U),
                           c.dscp_map.codes, self._red, self._reorder, self._notes)
        self._external: dict[str, int] | None = None  # the coordinator's batch ranks (set_order)
        self.infeasible: set[str] = set()  # ids of explicit flows seen with MLU > 1
        self._infeasible_of: dict[str, set[str]] = {}  # batch -> its ids in infeasible (freed by forget)
        self._red_cache: dict[tuple[float, ...], float] = {}  # deadlines -> RED
        self._window_seen = math.nan  # the last snapshot load_window accepted

    @property
    def native(self) -> bool:
        """Whether this policy decides in the C core (else on the reference)."""
        return self._native

    @property
    def flow_notes(self) -> bool:  # type: ignore[override]
        return self.state.note_levels

    @flow_notes.setter
    def flow_notes(self, value: bool) -> None:
        self.state.note_levels = bool(value)

    # ------------------------------------------------------------ coordinator

    def set_order(self, order: Mapping[str, int], pruned: Iterable[str]) -> None:
        """Adopt the coordinator's RED ranks and pruned requests.

        Called by the coordinator glue whenever a new order is published.
        From then on the policy stops ordering and pruning by itself; batches
        the order does not know yet (arrived after it was computed) rank
        after every known batch, among themselves by their own RED.
        """
        self._external = dict(order)
        self.state.set_pruned(pruned)

    @property
    def pruned_requests(self) -> set[str]:
        return self.state.pruned_names()

    # ------------------------------------------------------------ engine API

    def decide(self, snap: Snapshot) -> Decision:
        if snap.load_window != self._window_seen:
            self._check_window(snap.load_window)
        return self.state.decide(snap)

    def _check_window(self, window: float) -> None:
        """The link-load average the snapshots carry must be over MfsConfig.load_window."""
        if not math.isclose(window, self.config.load_window, rel_tol=1e-9):
            raise ValueError(
                f"mfs: the snapshot's link_load is a moving average over {window!r} s but "
                f"MfsConfig.load_window is {self.config.load_window!r} s; give the policy the window of "
                "whoever measures link load (the engine's or daemon's load_window)"
            )
        self._window_seen = window  # (checked once per distinct value: the snapshot's owner keeps one)

    def on_complete(self, flow: Flow, now: float) -> None:
        self.state.complete(flow)

    def forget(self, batches: Iterable[str]) -> None:
        """Free the batch and request table entries of ``batches`` (``FlowPolicy.forget``).

        Called by the node daemon when a batch has departed for good: its
        index and its requests' indices are handed out again to batches and
        requests seen later, so a daemon that sees a million requests keeps
        tables as large as the most it had live at once. A batch with live
        flows is freed at a later call, once they have completed. Requests
        the coordinator named (``set_order``) that no flow has joined to a
        batch and that are not pruned now are freed too, and so are the
        batch's flow ids in ``infeasible``. Names never seen are ignored.
        """
        for name in self.state.forget(batches):
            self.infeasible.difference_update(self._infeasible_of.pop(name, ()))

    def queue_level(self, flow: Flow) -> int:
        """RMLQ level of a live flow (K = scavenger); for tests and the daemon's DSCP."""
        return self.state.level(flow, True)

    def rmlq_level(self, flow: Flow) -> int:
        """RMLQ level of a live flow as promotion left it (pruning not applied)."""
        return self.state.level(flow, False)

    @property
    def dscp_map(self) -> DscpMap:
        return self.config.dscp_map

    def dscp(self, flow: Flow) -> int:
        """DSCP codepoint for a live flow's packets."""
        return self.config.dscp_map.dscp(self.queue_level(flow))

    # ------------------------------------------------------------ called back by the state

    def note_infeasible(self, flow: Flow) -> None:
        """Record that explicit ``flow`` was found with MLU > 1 (in ``infeasible``
        and ``Flow.state['infeasible']``); ``forget`` drops a batch's ids again."""
        self.infeasible.add(flow.id)
        flow.state["infeasible"] = True
        self._infeasible_of.setdefault(flow.batch, set()).add(flow.id)

    def _notes(self, flows: Sequence[Flow], noted: list[int], bad: list[int]) -> None:
        """A decision's notes: the infeasible flows (positions ``bad``), then the
        (position, RMLQ level) pairs ``noted`` on ``Flow.state``."""
        for i in bad:
            self.note_infeasible(flows[i])
        for k in range(0, len(noted), 2):
            flows[noted[k]].state["rmlq_level"] = noted[k + 1]

    def _red(self, deadlines: tuple[float, ...]) -> float:
        """RED of a batch's live deadlines (inf: none), memoized by them."""
        red = self._red_cache.get(deadlines)
        if red is None:
            red = robust_effective_deadline(deadlines).red if deadlines else math.inf
            if len(self._red_cache) >= 4096:  # bounded: deadlines are absolute, old ones never come back
                self._red_cache.clear()
            self._red_cache[deadlines] = red
        return red

    def _reorder(self, snap: Snapshot) -> None:
        """RED ranks for the live batches, and (standalone) Algorithm 1's pruning
        on ``snap``; called by the state when the order is stale.

        Ranks only order: the live batches are ranked with the batches that
        left since the last run and may come back (by the RED they had), so
        one that comes back with the RED it left with still has its place (the
        state then skips this call). Left batches are forgotten when there are
        more than twice as many as live ones (plus 16), and all of them when a
        RED is NaN (no order to keep).
        """
        state = self.state
        live = state.live_batches()
        known = self._external
        if known is not None:
            # The coordinator's ranks; batches it does not know yet after all of them, by their own RED.
            unknown = {name: state.deadlines(b) for _, name, b in live if name not in known}
            base = max(known.values(), default=-1) + 1
            ranked = [(b, known[name]) for _, name, b in live if name in known]
            order, _ = red_order(unknown)
            ranked.extend((state.batch_index(name), base + k) for k, name in enumerate(order))
            state.set_ranks(ranked, None)
            return
        gone = state.gone_batches()
        if len(gone) > 2 * len(live) + 16 or any(red != red for red, _, _ in live) or \
                any(red != red for red, _, _ in gone):
            gone = []
        keyed = live + gone
        keyed.sort()  # the names are distinct: b is never compared
        state.set_ranks([(b, k) for k, (_, _, b) in enumerate(keyed)], {b: red for red, _, b in keyed})
        if self.config.drop_budget > 0:
            self._prune(snap, live)

    def _prune(self, snap: Snapshot, live: list[tuple[float, str, int]]) -> None:
        """Algorithm 1 on the live flows' remaining bytes (no coordinator).

        Load of a request on a link: sum over its live flows of remaining x
        weight; a batch's compute: the largest ``downstream`` among its live
        flows (the time still needed after its transfers, counted without
        overlap, as the worst case asks); link bandwidth: capacity. Requests
        pruned earlier stay pruned (sticky: they are doomed, and moving them
        back and forth would reorder their messages); each run prunes at most
        ``drop_budget`` more. Collectives are left out of every request's load:
        pruning spares them, so pruning a request cannot take their bytes off
        a port.
        """
        # Algorithm 1's table as the coordinator keeps it: ports are the link
        # indices, requests listed batch by batch (flows in snapshot order),
        # one entry per (request, link) with its summed load.
        of_batch: dict[int, list] = {b: [] for _, _, b in live}
        for f, rem, owner in zip(snap.flows, snap.remaining.tolist(), self.state.owners(snap.flows)):
            if owner is not None and not owner[4] and owner[3] == owner[3] and f.stage is not Stage.COLLECTIVE:
                of_batch[owner[0]].append((f, rem, owner[2], owner[3]))
        table = LoadTableBuilder()
        for _, name, b in live:
            loads: dict[str, tuple[float, dict[int, float]]] = {}
            longest = 0.0
            for f, rem, request, deadline in of_batch[b]:
                load = loads.setdefault(request, (deadline, {}))[1]
                for link, w in zip(f.links.tolist(), f.weights.tolist()):
                    load[link] = load.get(link, 0.0) + rem * w
                longest = max(longest, f.downstream)
            if loads:
                table.add_batch(name, longest, ((r, d, load) for r, (d, load) in loads.items()))
        if table.batch_ids:
            self.state.prune(schedule_table(table.build(snap.now, self.config.drop_budget, snap.capacity)).pruned)
