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

Decisions run in C (:mod:`laxflow.policy.mfs.core`) when the module is
built, else on the reference here (vectorized, in NumPy): both give
bit-identical decisions and state, and the tests hold the C to the reference.

Called by the network engine (``decide`` on an incremental snapshot, at
every event: ``keeps_tags``; ``on_complete`` per finished flow), by the node daemon with the same objects, and by the
coordinator's glue through ``set_order``. One instance per network.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from laxflow.policy.arbitration import queue_of
from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.config import MfsConfig
from laxflow.policy.dscp import DscpMap
from laxflow.policy.flow import STAGE_CODES, Flow, Stage
from laxflow.policy.inter_request import LoadTableBuilder, schedule_table
from laxflow.policy.mfs import reference
from laxflow.policy.mfs.core import NATIVE, NativeCore, bottleneck, decide_native, decide_tagged
from laxflow.policy.mlu import thresholds
from laxflow.policy.red import red_order, robust_effective_deadline
from laxflow.policy.rmlq import Rmlq

_NAN = float("nan")


class MfsPolicy(FlowPolicy):
    """RMLQ with MLU/RLI promotion, RED order, pruning into a scavenger class."""

    name = "mfs"
    keeps_tags = True  # its RMLQ slots ride in Snapshot.tag / Decision.tag (the network engine)
    # Every decision in C (core.py) when the module is built; False:
    # the reference below (vectorized). The same decisions and state either way.
    native = NATIVE

    def __init__(self, config: MfsConfig | None = None, **options: Any) -> None:
        self.config = config if config is not None else MfsConfig.from_mapping(options)
        k = self.config.levels
        self._q = thresholds(k, self.config.E, self.config.U)
        self._q_ascending = self._q[::-1].tolist()
        self._dscp_codes = self.config.dscp_map.codes  # queue -> DSCP, index K = scavenger
        self.rmlq = Rmlq(k, self.config.period)
        # Batch and request tables (index -> name / facts), grown on first sight.
        self._batch_index: dict[str, int] = {}
        self._batch_names: list[str] = []
        self._batch_live: list[int] = []
        self._rank = np.zeros(16, np.int64)  # RED rank per batch index
        self._request_index: dict[str, int] = {}
        self._request_names: list[str] = []
        self._request_deadline: list[float] = []
        self._request_batch: list[int] = []
        self._pruned = np.zeros(16, bool)  # per request index
        # Indices freed by forget(), handed out again before the tables grow;
        # each batch's requests (to free them with it); batches forget() was
        # told of while they still had live flows.
        self._free_batches: list[int] = []
        self._free_requests: list[int] = []
        self._batch_requests: dict[int, list[int]] = {}
        self._forget_pending: set[str] = set()
        self._unbatched: set[int] = set()  # requests set_order named that no flow joined to a batch yet
        self._live_flows: dict[int, dict[Flow, int]] = {}  # batch index -> its live flows -> request index
        self._live_requests: dict[int, dict[int, int]] = {}  # batch index -> request index -> live flows
        self._order_stale = True
        # A live batch's RED changed since the last reorder (one of its
        # requests came or went): a departure must then re-rank the rest.
        self._red_moved = False
        self._external = False
        self.infeasible: set[str] = set()  # ids of explicit flows seen with MLU > 1
        self._infeasible_of: dict[str, set[str]] = {}  # batch -> its ids in infeasible (freed by forget)
        # Moving average of explicit-deadline traffic per link (see mlu.py: rho).
        self._explicit_load = np.zeros(0)
        self._finished_bytes = np.zeros(0)  # explicit bytes of flows done since the last decision
        self._finished_links: set[int] = set()  # where _finished_bytes is not 0
        self._last_t: float | None = None
        self._bneck_cache: dict[tuple[int, int], tuple] = {}  # see core.bottleneck
        self._red_cache: dict[tuple[float, ...], float] = {}  # a batch's live deadlines -> RED (_red_sorted)
        # A batch's live requests (indices, in the order they came) -> RED; cleared
        # when a request's deadline is set after its index was made (set_order).
        self._red_by_requests: dict[tuple[int, ...], float] = {}
        # RED per live batch (_red_sorted); dropped whenever the batch's live requests change.
        self._batch_red: dict[int, float] = {}
        # The batches the last full reorder ranked (live then, or gone but
        # remembered: a batch leaves and comes back at each of its layers),
        # each with the RED it was ranked by; and the batches that became live
        # or whose live requests changed since. See _ranks_hold.
        self._ranked_red: dict[int, float] = {}
        self._touched: set[int] = set()
        self._window_seen = math.nan  # the last snapshot load_window accepted
        self._native: NativeCore | None = None  # the native path's C state, made on its first decision
        self._glue: Any = None  # its admission and completion in C (glue.c), when built
        # Bumped whenever _rank, _pruned, _explicit_load or _finished_bytes is
        # replaced by another array: the C state binds them again (NativeCore).
        self._arrays_gen = 0
        # Whether the C step's per-slot request progress is as the last incremental
        # decision left it (decide_tagged; another path's decision resets it).
        self._progress_kept = False

    # ------------------------------------------------------------ coordinator

    def set_order(self, order: Mapping[str, int], pruned: Iterable[str]) -> None:
        """Adopt the coordinator's RED ranks and pruned requests.

        Called by the coordinator glue whenever a new order is published.
        From then on the policy stops ordering and pruning by itself; batches
        the order does not know yet (arrived after it was computed) rank
        after every known batch, among themselves by their own RED.
        """
        self._external = True
        self._external_order = dict(order)
        self._pruned[:] = False
        for name in pruned:
            r = self._request_slot(name, _NAN, -1)  # may grow self._pruned: index after
            self._pruned[r] = True
        self._order_stale = True

    @property
    def pruned_requests(self) -> set[str]:
        return {self._request_names[i] for i in np.flatnonzero(self._pruned[: len(self._request_names)])}

    # ------------------------------------------------------------ engine API

    def decide(self, snap: Snapshot) -> Decision:
        if snap.tag is not None and self.native and NATIVE and snap.load_window == self._window_seen and snap.flows:
            return decide_tagged(self, snap)  # (the network engine's every decision: its C path first)
        flows = snap.flows
        n = len(flows)
        if snap.load_window != self._window_seen:
            self._check_window(snap.load_window)
        if n == 0:
            empty = np.zeros(0, np.int64)
            return Decision(level=empty, queue=empty, dscp=np.zeros(0, np.uint8))
        if self.native and NATIVE:
            return decide_tagged(self, snap) if snap.tag is not None else decide_native(self, snap)
        self._progress_kept = False  # (the C step's per-slot progress is not this path's)
        if self._native is not None:  # nor the C side's view of the arrays it changes: re-bound at its next decision
            self._native.unbind()
        now = snap.now
        slot = self.rmlq.slot
        idx_list = [slot.get(f, -1) for f in flows]
        idx = np.fromiter(idx_list, np.int64, n)
        new_pos = np.flatnonzero(idx < 0)
        if new_pos.size:
            idx[new_pos] = self._admit([flows[i] for i in new_pos.tolist()], snap)
        current = np.fromiter(
            (_NAN if (c := f.current_layer) is None else c for f in flows), float, n
        )
        compute_done = np.fromiter((f.compute_done for f in flows), bool, n)
        is_new = np.zeros(n, bool)
        is_new[new_pos] = True
        self._measure_explicit_load(snap, idx, is_new)

        if new_pos.size:
            pos = new_pos
            entry = self._candidates(idx[pos], pos, snap, current)
            self.rmlq.set_entry(idx[pos], entry, current[pos], now)
            self._note_levels(flows, pos, idx[pos])
        pos = np.flatnonzero(~is_new)
        if pos.size:
            elig = self.rmlq.eligible(idx[pos], current[pos], compute_done[pos], now)
            pos = pos[elig]
            if pos.size:
                changed = self.rmlq.promote(idx[pos], self._candidates(idx[pos], pos, snap, current), current[pos], now)
                self._note_levels(flows, pos[changed], idx[pos[changed]])

        if self._order_stale:
            self._reorder(snap)
        level, queue, dscp, timer = reference.arbitrate(self.rmlq, idx, self._pruned, self._rank, self.config.levels,
                                                        self._dscp_codes, compute_done, now)
        self.rmlq.last_rem[idx] = snap.remaining
        return Decision(level=level, queue=queue, dscp=dscp, timers=() if timer is None else (timer,),
                        tag=None if snap.tag is None else idx)

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
        glue = self._glue
        if glue is not None and glue.complete(flow):  # (the same steps in C; False: nothing done, they run here)
            return
        t = self.rmlq
        s = t.release(flow)  # (its slot is free from here; nothing below hands it out)
        if s is None:
            return
        facts = t.facts[s]
        if facts is None:  # admission never finished (a decide that raised): the arrays hold what there is
            facts = (bool(t.explicit[s]), 0, int(t.bneck_link[s]), 0.0, float(t.bneck_weight[s]), int(t.batch[s]))
        b = facts[5]
        if facts[0] and self._finished_bytes.size:
            # Its last bytes moved since the last decision: count them there.
            link = facts[2]
            self._finished_bytes[link] += t.last_rem[s] * facts[4]
            self._finished_links.add(link)
        live = self._live_flows.get(b)
        if live is None:
            return
        r = live.pop(flow)
        requests = self._live_requests[b]
        count = requests[r] - 1
        if count:
            requests[r] = count
            return
        del requests[r]
        self._batch_red.pop(b, None)  # its live deadlines changed
        self._touched.add(b)
        if live:
            self._red_moved = True
            return
        del self._live_flows[b]
        del self._live_requests[b]
        # Batch departure: Algorithm 1 runs again, unless it would only close
        # the departed batch's gap in the ranks: no pruning to redo, no
        # coordinator order, and no live batch's RED moved since the last
        # run. Levels depend on the ranks' order alone, so they are the same
        # either way.
        if self._red_moved or self._external or self.config.drop_budget > 0:
            self._order_stale = True

    def queue_level(self, flow: Flow) -> int:
        """RMLQ level of a live flow (K = scavenger); for tests and the daemon's DSCP."""
        s = self.rmlq.slot[flow]
        idx = np.array([s])
        scavenged = reference.scavenged(self.rmlq, idx, self._pruned)
        return int(queue_of(self.rmlq.urgency[idx], self.rmlq.explicit[idx], scavenged, self.config.levels)[0])

    def rmlq_level(self, flow: Flow) -> int:
        """RMLQ level of a live flow as promotion left it (pruning not applied)."""
        s = self.rmlq.slot[flow]
        return int(queue_of(self.rmlq.urgency[[s]], self.rmlq.explicit[[s]], np.zeros(1, bool), self.config.levels)[0])

    @property
    def dscp_map(self) -> DscpMap:
        return self.config.dscp_map

    def dscp(self, flow: Flow) -> int:
        """DSCP codepoint for a live flow's packets."""
        return self.config.dscp_map.dscp(self.queue_level(flow))

    # ------------------------------------------------------------ internals

    def _admit(self, new: list[Flow], snap: Snapshot) -> np.ndarray:
        """Slots for newly seen flows, with their static facts filled in."""
        t = self.rmlq
        slots = np.fromiter((t.allocate(f) for f in new), np.int64, len(new))
        # Bottleneck link of each path (first link attaining the min of
        # capacity / weight), per flow: cached per transfer shape.
        for f, s in zip(new, slots.tolist()):
            t.bneck_link[s], t.bneck_rate[s], t.bneck_weight[s] = bottleneck(self, f, snap.capacity)
        t.last_rem[slots] = np.fromiter((f.size for f in new), float, len(new))
        t.explicit[slots] = np.fromiter((f.has_explicit_deadline for f in new), bool, len(new))
        t.stage[slots] = np.fromiter((STAGE_CODES[f.stage] for f in new), np.int8, len(new))
        t.target[slots] = np.fromiter((_NAN if f.layer is None else f.layer for f in new), float, len(new))
        t.due[slots] = np.fromiter((_NAN if (d := f.due) is None else d for f in new), float, len(new))
        for f, s in zip(new, slots.tolist()):
            self._register(f, s)
        t.set_facts(slots.tolist())
        return slots

    def _register(self, f: Flow, s: int) -> tuple[int, int]:
        """Enter a new flow (slot ``s``) in the batch and request tables; its (batch, request) indices."""
        b, r = self._enter(f)
        t = self.rmlq
        t.batch[s] = b
        t.request[s] = r
        return b, r

    def _enter(self, f: Flow) -> tuple[int, int]:
        """:meth:`_register` but for the slot arrays' batch and request (the caller writes them)."""
        return self._enter_many((f,))[0]

    def _enter_many(self, flows) -> list[tuple[int, int]]:
        """:meth:`_enter` for each of ``flows``, in order (admission's batch of them)."""
        batch_index, request_index, request_batch = self._batch_index, self._request_index, self._request_batch
        live_flows, live_requests, touched = self._live_flows, self._live_requests, self._touched
        out = []
        for f in flows:
            b = batch_index.get(f.batch)
            if b is None:
                b = self._batch_slot(f.batch)
            r = request_index.get(f.request)
            if r is None or request_batch[r] < 0:
                r = self._request_slot(f.request, _NAN if f.deadline is None else f.deadline, b)
            live = live_flows.get(b)
            if live is None:  # the batch is live (again): its rank is Algorithm 1's to give
                live = live_flows[b] = {}
                live_requests[b] = {}
                touched.add(b)
                self._order_stale = True
            live[f] = r
            requests = live_requests[b]
            count = requests.get(r)
            if count is None:
                requests[r] = 1
                self._batch_red.pop(b, None)  # its live deadlines changed
                touched.add(b)
                self._red_moved = True
            else:
                requests[r] = count + 1
            out.append((b, r))
        return out

    def _batch_slot(self, name: str) -> int:
        b = self._batch_index.get(name)
        if b is None:
            if self._free_batches:  # (an index forget() freed)
                b = self._free_batches.pop()
                self._batch_names[b] = name
            else:
                b = len(self._batch_names)
                self._batch_names.append(name)
            self._batch_index[name] = b
            if b >= len(self._rank):
                self._rank = np.concatenate([self._rank, np.zeros(len(self._rank), np.int64)])
                self._arrays_gen += 1
            self._rank[b] = np.iinfo(np.int64).max // 2  # until ordered: last
            self._order_stale = True
        return b

    def _request_slot(self, name: str, deadline: float, batch: int) -> int:
        r = self._request_index.get(name)
        if r is None:
            if self._free_requests:  # (an index forget() freed; its _pruned flag is False)
                r = self._free_requests.pop()
                self._request_names[r] = name
                self._request_deadline[r] = deadline
                self._request_batch[r] = batch
            else:
                r = len(self._request_names)
                self._request_names.append(name)
                self._request_deadline.append(deadline)
                self._request_batch.append(batch)
            self._request_index[name] = r
            if r >= len(self._pruned):
                self._pruned = np.concatenate([self._pruned, np.zeros(len(self._pruned), bool)])
                self._arrays_gen += 1
            self._order_stale = True
            if batch >= 0:
                self._batch_requests.setdefault(batch, []).append(r)
            else:
                self._unbatched.add(r)
        elif batch >= 0 and self._request_batch[r] < 0:  # first named by set_order
            self._request_deadline[r] = deadline
            self._red_by_requests.clear()
            self._request_batch[r] = batch
            self._batch_requests.setdefault(batch, []).append(r)
            self._unbatched.discard(r)
        return r

    def forget(self, batches: Iterable[str]) -> None:
        """Free the batch and request table entries of ``batches`` (``FlowPolicy.forget``).

        Called by the node daemon when a batch has departed for good: its
        index and its requests' indices are handed out again to batches and
        requests seen later, so a daemon that sees a million requests keeps
        tables as large as the most it had live at once. A batch with live
        flows is freed at a later call, once they have completed. Requests
        the coordinator named (``set_order``) that no flow has joined to a
        batch and that are not pruned now are freed too, and so are the
        batch's flow ids in ``infeasible``. The RED memo by
        request indices is cleared when any request is freed (its keys could
        name a reused index). Names never seen are ignored.
        """
        pending = self._forget_pending
        pending.update(batches)
        freed_requests = False
        for name in list(pending):
            b = self._batch_index.get(name)
            if b is None:
                pending.discard(name)
                continue
            if b in self._live_flows:  # still has live flows: at a later call
                continue
            pending.discard(name)
            self.infeasible.difference_update(self._infeasible_of.pop(name, ()))
            del self._batch_index[name]
            self._batch_names[b] = None
            self._free_batches.append(b)
            self._ranked_red.pop(b, None)
            self._batch_red.pop(b, None)
            self._touched.discard(b)
            for r in self._batch_requests.pop(b, ()):
                self._free_request(r)
                freed_requests = True
        for r in [r for r in self._unbatched if not self._pruned[r]]:
            self._free_request(r)
            freed_requests = True
        if freed_requests:
            self._red_by_requests.clear()

    def note_infeasible(self, flow: Flow) -> None:
        """Record that explicit ``flow`` was found with MLU > 1 (in ``infeasible``
        and ``Flow.state['infeasible']``); called by the decision step, the
        reference's or the core's. ``forget`` drops a batch's ids again."""
        self.infeasible.add(flow.id)
        flow.state["infeasible"] = True
        self._infeasible_of.setdefault(flow.batch, set()).add(flow.id)

    def _free_request(self, r: int) -> None:
        """Request index ``r``'s entries freed, the index handed out again later
        (forget); kept, as another live batch's, while a live batch holds it."""
        for b, requests in self._live_requests.items():
            if r in requests:
                self._request_batch[r] = b
                self._batch_requests.setdefault(b, []).append(r)
                return
        self._unbatched.discard(r)
        del self._request_index[self._request_names[r]]
        self._request_names[r] = None
        self._request_deadline[r] = _NAN
        self._request_batch[r] = -1
        self._pruned[r] = False
        self._free_requests.append(r)

    def _candidates(self, idx: np.ndarray, pos: np.ndarray, snap: Snapshot, current: np.ndarray) -> np.ndarray:
        """Urgency each flow (at snapshot positions ``pos``) would have now
        (:func:`reference.candidates`); the infeasible ones noted."""
        out, bad = reference.candidates(self.rmlq, idx, current[pos], snap.remaining[pos], snap.link_load,
                                        self._explicit_load, snap.now, self._q, self.config.levels)
        for i in pos[bad]:
            self.note_infeasible(snap.flows[i])
        return out

    def _measure_interval(self, snap: Snapshot) -> tuple[float, float] | None:
        """Start a measurement of the explicit-traffic average: (last decision, now), None if no time passed.

        Sizes the per-link arrays to the snapshot's links and moves the
        clock to ``snap.now``.
        """
        return self._measure_interval_at(snap.now, len(snap.capacity))

    def _measure_interval_at(self, now: float, links: int) -> tuple[float, float] | None:
        """:meth:`_measure_interval` at time ``now`` on ``links`` links (the native path's, without a snapshot)."""
        if self._explicit_load.size != links:
            self._fit_links(links)
        last = self._last_t
        self._last_t = now
        if last is None or now <= last:
            return None
        return last, now

    def _fit_links(self, links: int) -> None:
        """Per-link averages for ``links`` links (the network's link count changed: they start over at 0)."""
        self._explicit_load = np.zeros(links)
        self._finished_bytes = np.zeros(links)
        self._arrays_gen += 1
        self._finished_links.clear()

    def _measure_explicit_load(self, snap: Snapshot, idx: np.ndarray, is_new: np.ndarray) -> None:
        """Advance the explicit-traffic moving average over [last decision, now]."""
        interval = self._measure_interval(snap)
        if interval is None:
            return
        last, now = interval
        t = self.rmlq
        moved = t.explicit[idx] & ~is_new
        if not self._finished_links and not moved.any():
            # No explicit bytes moved: utilization 0 on every link, the average only decays.
            self._explicit_load *= math.exp(-(now - last) / self.config.load_window)
            return
        self._explicit_load = reference.explicit_load(self._explicit_load, t, idx, moved, snap.remaining,
                                                      self._finished_bytes, snap.capacity, now - last,
                                                      self.config.load_window)
        self._arrays_gen += 1
        self._finished_bytes[:] = 0.0
        self._finished_links.clear()

    def _note_levels(self, flows: Any, pos: np.ndarray, idx: np.ndarray) -> None:
        if not pos.size or not self.flow_notes:
            return
        q = queue_of(self.rmlq.urgency[idx], self.rmlq.explicit[idx], np.zeros(idx.size, bool), self.config.levels)
        for i, lv in zip(pos.tolist(), q.tolist()):
            flows[i].state["rmlq_level"] = lv

    def _reorder(self, snap: Snapshot | Callable[[], Snapshot]) -> bool:
        """RED ranks for the live batches, and (standalone) Algorithm 1's pruning
        (on ``snap``: a snapshot, or a function giving one, called only then).

        Returns whether any live batch's rank changed. Ranks only order: the
        live batches are ranked with the batches that left since and may come
        back (as they were), so one that comes back with the RED it left with
        still has its place, and nothing is written (see :meth:`_ranks_hold`).
        """
        self._order_stale = self._red_moved = False
        if not self._external and self.config.drop_budget <= 0 and self._ranks_hold():
            return False
        self._touched.clear()
        live = list(self._live_flows)
        rank = self._rank
        if self._external:
            # The coordinator's ranks; batches it does not know yet after all of them, by their own RED.
            known = self._external_order
            unknown = {self._batch_names[b]: self._deadlines(b) for b in live if self._batch_names[b] not in known}
            base = max(known.values(), default=-1) + 1
            ranked = [(b, known[name]) for b in live if (name := self._batch_names[b]) in known]
            order, _ = red_order(unknown)
            ranked.extend((self._batch_index[name], base + k) for k, name in enumerate(order))
        else:
            ranked = self._rank_with_returning(live)
        moved = False
        item, live_now = rank.item, self._live_flows  # (a Python int: cheaper than rank[b] and its NumPy comparison)
        for b, k in ranked:
            if item(b) != k:
                rank[b] = k
                moved = moved or b in live_now
        if not self._external and self.config.drop_budget > 0:
            self._prune(snap if isinstance(snap, Snapshot) else snap(), live)
        return moved

    def _ranks_hold(self) -> bool:
        """Whether the ranks the last full reorder wrote still order the live
        batches as a full reorder would: true when every batch that became live
        or whose live requests changed since is gone again or was ranked then
        with the RED it has now (its place among the others is where it was;
        batches that left only leave gaps)."""
        ranked, live = self._ranked_red, self._live_flows
        for b in self._touched:
            if b in live and ranked.get(b) != self._red_of(b):
                return False
        self._touched.clear()
        return True

    def _rank_with_returning(self, live: list[int]) -> list[tuple[int, int]]:
        """(batch, rank) in :meth:`_red_sorted`'s order for the live batches and
        the batches the last full reorder ranked that have left since (by the
        RED they had), so those keep a place to come back to; the live ones'
        order is :meth:`_red_sorted`'s. Left batches are forgotten when there
        are more than twice as many as live ones (plus 16), and all of them
        when a RED is NaN (no order to keep)."""
        names, ranked = self._batch_names, self._ranked_red
        keyed = [(self._red_of(b), names[b], b) for b in live]
        live_set = self._live_flows
        gone = [(red, names[b], b) for b, red in ranked.items() if b not in live_set]
        if len(gone) > 2 * len(live) + 16 or any(red != red for red, _, _ in keyed) or \
                any(red != red for red, _, _ in gone):
            gone = []
        keyed.extend(gone)
        keyed.sort()  # the names are distinct: b is never compared
        self._ranked_red = {b: red for red, _, b in keyed}
        return [(b, k) for k, (_, _, b) in enumerate(keyed)]

    def _red_of(self, b: int) -> float:
        """RED of live batch ``b`` by its live deadlines, memoized (see :meth:`_red_sorted`)."""
        red = self._batch_red.get(b)
        return self._red_from_deadlines(b) if red is None else red

    def _deadlines(self, b: int) -> list[float]:
        return [d for r in self._live_requests[b] if not math.isnan(d := self._request_deadline[r])]

    def _red_sorted(self, live: list[int]) -> list[int]:
        """``live`` batches in ``red.red_order``'s order (ascending RED, ties by
        name), with each batch's RED looked up by its deadlines: a batch's live
        requests change far less often than batches come and go (a reorder
        at every batch departure), so most REDs were computed before."""
        names = self._batch_names
        keyed = [(self._red_of(b), names[b], b) for b in live]
        keyed.sort()  # the names are distinct: b is never compared
        return [b for _, _, b in keyed]

    def _red_from_deadlines(self, b: int) -> float:
        """Live batch ``b``'s RED from its deadlines, memoized for ``b``; cached by
        its live requests (a batch leaves and comes back with the same ones at
        each of its layers) and by the deadlines themselves."""
        requests = tuple(self._live_requests[b])
        red = self._red_by_requests.get(requests)
        if red is None:
            cache = self._red_cache
            deadlines = tuple(self._deadlines(b))
            red = cache.get(deadlines)
            if red is None:
                red = robust_effective_deadline(deadlines).red if deadlines else math.inf
                if len(cache) >= 4096:  # bounded: deadlines are absolute, old ones never come back
                    cache.clear()
                cache[deadlines] = red
            if len(self._red_by_requests) >= 4096:  # bounded: requests finish and never come back
                self._red_by_requests.clear()
            self._red_by_requests[requests] = red
        self._batch_red[b] = red
        return red

    def _prune(self, snap: Snapshot, live: list[int]) -> None:
        """Algorithm 1 on the live flows' remaining bytes (no coordinator).

        Load of a request on a link: sum over its live flows of remaining x
        weight; a batch's compute: the largest ``downstream`` among its live
        flows (the time still needed after its transfers, counted without
        overlap, as the worst case asks); link bandwidth: capacity. Requests
        pruned earlier stay pruned (sticky: they are doomed, and moving them
        back and forth would reorder their messages); each run prunes at most
        ``drop_budget`` more. Collectives are left out of every request's load:
        pruning spares them (see :func:`reference.scavenged`), so pruning a request
        cannot take their bytes off a port.
        """
        remaining = {f: r for f, r in zip(snap.flows, snap.remaining)}
        # Algorithm 1's table as the coordinator keeps it: ports are the link
        # indices, requests listed batch by batch, one entry per (request,
        # link) with its summed load.
        table = LoadTableBuilder()
        for b in live:
            loads: dict[int, dict[int, float]] = {}
            longest = 0.0
            for f, r in self._live_flows[b].items():
                if (
                    self._pruned[r]
                    or math.isnan(self._request_deadline[r])
                    or f.stage is Stage.COLLECTIVE
                    or f not in remaining
                ):
                    continue
                load = loads.setdefault(r, {})
                for link, w in zip(f.links.tolist(), f.weights.tolist()):
                    load[link] = load.get(link, 0.0) + float(remaining[f]) * w
                longest = max(longest, f.downstream)
            if loads:
                requests = ((self._request_names[r], self._request_deadline[r], load) for r, load in loads.items())
                table.add_batch(self._batch_names[b], longest, requests)
        if not table.batch_ids:
            return
        result = schedule_table(table.build(snap.now, self.config.drop_budget, snap.capacity))
        for name in result.pruned:
            self._pruned[self._request_index[name]] = True
