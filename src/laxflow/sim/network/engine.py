"""The event-driven fluid network.

:class:`FluidNetwork` owns the live flows of one simulated network and moves
their bytes. Between events every flow's rate is constant, so bytes and
completion times are exact: at each event the engine advances every live
flow's ``remaining`` by ``rate * dt`` and the next completion is
``now + min(remaining / rate)``.

Events (all on the shared :class:`~laxflow.sim.events.EventQueue`):

* the owner calls :meth:`FluidNetwork.add_flow` (usually from its own
  ARRIVAL handler) or :meth:`FluidNetwork.reschedule` (a layer boundary);
* a COMPLETION event delivers the last bytes of every flow that ends at that
  time, then calls ``policy.on_complete`` and the flow's callback;
* a TIMER event fires a time the policy asked for;
* any of these schedules one RECOMPUTE at the same time (coalesced: one per
  timestamp), which asks the policy for levels and caps and reallocates
  rates. Levels below the lowest one an event touched keep their rates, which
  is exact (see :func:`~laxflow.sim.network.allocator.allocate`).

Live-flow state is kept in Python lists in admission order, with the Flow
objects alongside (a serving run has 1-3 live flows at the median, where a
NumPy call costs more than the arithmetic); NumPy takes over in the
per-flow passes when many flows are live (``VECTOR_FROM``), doing the same
float operations, and the rate allocation runs in C (see
:mod:`~laxflow.sim.network.allocator`). Flows that finish are dropped before
the next decision.

``Snapshot.link_load`` is an exponentially weighted moving average of each
link's utilization (used bytes/s over capacity) with time constant
``load_window`` seconds (stated in ``Snapshot.load_window``; MFS checks it): over an interval dt at constant utilization u,
``load <- u + (load - u) * exp(-dt / load_window)``. That is exact for the
engine's piecewise-constant rates.
"""

from __future__ import annotations

import math
from itertools import accumulate
from operator import truediv
from functools import cached_property
from typing import Callable

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.flow import STAGE_CODES, STAGE_OF_CODE, Flow, Stage
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network.allocator import CapacityBuffer, Usage, allocate, allocate_lists
from laxflow.sim.network.topology import Topology

# A flow with at most this fraction of its bytes left is done: flows that end
# at the same time in exact arithmetic then complete at the same event.
DONE_REL_EPS = 1e-9
# ... and so is one whose last bytes would take less than this (relative to
# now) to send: its finish time is not representable as later than now.
DONE_TIME_EPS = 1e-12
# From this many live flows the per-flow passes (bytes sent, completions) run
# in NumPy; below it in Python floats (the same operations, so the same bits).
VECTOR_FROM = 192
# Up to this many live flows their CSR is looked up by their usage arrays
# (the same few shapes recur); from _CSR_CUT_FROM on, finished flows are cut
# out of the CSR rather than rebuilding it.
_CSR_CACHE_UP_TO = 8
_CSR_CUT_FROM = 48
_NUM_CODES = max(STAGE_CODES.values()) + 1  # bincount length over stage codes
_STAGE_ITEMS = tuple(STAGE_OF_CODE.items())
_INF = math.inf
_I64 = np.dtype(np.int64)

Callback = Callable[[Flow], None]


class FluidNetwork:
    """Flow-level network: strict priority across levels, max-min fair inside one.

    One instance per simulated network, driven by the owner's event loop on
    one thread. The owner shares ``queue`` (it pushes its own events onto it)
    and either calls :meth:`run` or steps the queue itself. ``load_window``
    (seconds, default 10 ms: a few layers of a prefill) is the time constant
    of ``Snapshot.link_load``, which is kept when the policy reads it
    (``FlowPolicy.reads_link_load``) or ``track_link_load`` is True.
    """

    def __init__(
        self,
        topology: Topology,
        policy: FlowPolicy,
        queue: EventQueue | None = None,
        load_window: float = 0.01,
        track_link_load: bool | None = None,
    ) -> None:
        if not load_window > 0:
            raise ValueError(f"load_window must be > 0 s (got {load_window!r})")
        self.topology = topology
        self.policy = policy
        self.queue = queue if queue is not None else EventQueue()
        self.load_window = float(load_window)
        self.capacity = topology.capacity
        self._capacity_list = self.capacity.tolist()
        self._capacity_buf = CapacityBuffer(self.capacity)
        self.bytes_delivered_by_stage: dict[Stage, float] = {s: 0.0 for s in Stage}
        # The moving average is kept only when someone reads it: the policy
        # (``reads_link_load``) or the owner (``track_link_load=True``).
        self._track_load = policy.reads_link_load if track_link_load is None else bool(track_link_load)
        self._link_load = np.zeros(topology.num_links)
        self._load_idle = True  # link_load and the utilization are all 0 (until the first rates)
        self.events = 0  # engine events handled (completions, timers, recomputes)

        # Live flows, one entry per flow in admission order in every list.
        self._flows: list[Flow] = []
        self._callbacks: list[Callback | None] = []
        self._remaining: list[float] = []
        self._rate: list[float] = []
        self._size: list[float] = []
        self._arrival: list[float] = []
        self._stage: list[int] = []
        # Fastest rate each flow could get alone (min over its links of
        # capacity / weight): capacities never change, so it is set once.
        self._bneck: list[float] = []
        self._links: list[np.ndarray] = []  # merged usage vector per flow
        self._weights: list[np.ndarray] = []
        self._nnz: list[int] = []  # entries per flow
        self._dead: list[bool] = []
        self._gone: list[int] = []  # positions of dead flows, until the next compaction
        # The last decision per flow (-1 / inf / -1 / 0 before the first).
        self._level: list[int] = []
        self._cap: list[float] = []
        self._queue: list[int] = []
        self._dscp: list[int] = []
        self._csr: Usage | None = None  # the live usage vectors as one CSR (built when rates are needed)
        self._csr_cache: dict[tuple[int, ...], tuple] = {}  # CSR of a few flows' usage arrays, by their ids
        self._pending: list[tuple[Flow, Callback | None, np.ndarray, np.ndarray, float]] = []
        # Merged usage of read-only (links, weights) arrays, by their ids: the
        # serving simulator gives every flow of one transfer shape the same
        # frozen arrays, so each shape is merged and checked once. The value
        # holds the arrays themselves, so their ids cannot be reused.
        self._usage_cache: dict[tuple[int, int], tuple] = {}
        self._removed_min_level: int | None = None  # lowest level a removal touched
        # Utilization of the links live flows use (all others are at 0), as
        # (link indices, values): the average's update touches only those.
        self._util_links = np.zeros(0, dtype=np.int64)
        self._util = np.zeros(0)
        self._t = self.queue.now  # time up to which bytes are accounted
        self._recompute_at: float | None = None
        self._completion_gen = 0
        self._timers: set[float] = set()
        self._pos: dict[int, int] | None = None
        self._members: set[int] = set()  # id() of live and pending flows

    # -- owner API --------------------------------------------------------------

    @property
    def link_load(self) -> np.ndarray:
        """Per-link utilization EWMA (see the module doc); the engine's own array, do not write."""
        if not self._track_load:
            raise RuntimeError(
                f"link_load is not kept: policy {type(self.policy).__name__} does not read it "
                "(pass track_link_load=True to FluidNetwork to keep it)"
            )
        return self._link_load

    @property
    def live(self) -> list[Flow]:
        """Live flows (admitted, unfinished) in admission order.

        Flows added at this timestamp are included; they get their first
        rate at this timestamp's recompute.
        """
        self._compact()
        return self._flows + [p[0] for p in self._pending]

    def add_flow(self, flow: Flow, on_complete: Callback | None = None) -> None:
        """Admit ``flow`` now; rates are recomputed at this timestamp.

        Called by the owner at ``queue.now`` (from any event handler). The flow
        must not be live already; ``flow.arrival`` is set to now if it is
        earlier. ``on_complete(flow)`` runs when its last byte is delivered
        (at COMPLETION priority, after ``policy.on_complete``).
        """
        now = self.queue.now
        if flow.finish is not None or id(flow) in self._members:
            raise ValueError(f"flow {flow.id!r} was already added")
        links, weights, bneck = self._usage_of(flow)
        if flow.arrival < now:
            flow.arrival = now
        if now > self._t:
            self._advance(now)
        self._pending.append((flow, on_complete, links, weights, bneck))
        self._members.add(id(flow))
        if self._recompute_at != now:
            self._schedule_recompute()

    def reschedule(self) -> None:
        """Ask the policy again at ``queue.now`` (the owner changed request state)."""
        now = self.queue.now
        if now > self._t:
            self._advance(now)
        if self._recompute_at != now:
            self._schedule_recompute()

    def _usage_of(self, flow: Flow) -> tuple[np.ndarray, np.ndarray, float]:
        """The flow's merged usage vector and its bottleneck rate alone (min of capacity / weight)."""
        if not (math.isfinite(flow.size) and flow.size > 0):
            raise ValueError(f"flow {flow.id!r}: size must be finite and > 0 (got {flow.size!r})")
        links, weights = flow.links, flow.weights
        frozen = not (links.flags.writeable or weights.flags.writeable)
        if frozen:
            hit = self._usage_cache.get((id(links), id(weights)))
            if hit is not None:
                return hit[2], hit[3], hit[4]
        merged, merged_w = _merge_links(flow, self.topology.num_links)
        capacity = self._capacity_list
        bneck = min([capacity[link] / w for link, w in zip(merged.tolist(), merged_w.tolist())])
        if frozen:
            if len(self._usage_cache) >= 4096:  # bounded: many distinct frozen arrays is not the serving case
                self._usage_cache.clear()
            self._usage_cache[(id(links), id(weights))] = (links, weights, merged, merged_w, bneck)
        return merged, merged_w, bneck

    def _position(self, flow: Flow) -> int | None:
        self._compact()
        if self._pos is None:
            self._pos = {id(f): i for i, f in enumerate(self._flows)}
        return self._pos.get(id(flow))

    def rate_of(self, flow: Flow) -> float:
        """Current rate of ``flow`` in bytes/s (0 if not live or not yet allocated)."""
        i = self._position(flow)
        return 0.0 if i is None else float(self._rate[i])

    def remaining_of(self, flow: Flow) -> float:
        """Bytes ``flow`` still has to send at ``queue.now``."""
        self._advance(self.queue.now)
        i = self._position(flow)
        if i is not None:
            return float(self._remaining[i])
        return float(flow.size) if id(flow) in self._members else 0.0  # pending: nothing sent yet

    def run(self, until: float = float("inf")) -> int:
        """Run the shared queue until ``until``; returns how many events ran."""
        return self.queue.run(until)

    # -- time ---------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Account bytes and link load from the last event up to ``now``."""
        dt = now - self._t
        if dt <= 0:
            return
        self._t = now
        n = len(self._rate)
        if n >= VECTOR_FROM:
            sent = np.array(self._rate) * dt
            remaining = np.array(self._remaining)
            np.minimum(sent, remaining, out=sent)
            remaining -= sent
            self._remaining = remaining.tolist()
            by_stage = np.bincount(self._stage, weights=sent, minlength=_NUM_CODES).tolist()
            self._add_delivered(by_stage)
        elif n:
            # As the NumPy pass: sent = min(rate * dt, remaining) (np.minimum
            # keeps the first when equal), summed per stage in flow order from 0.0.
            by_stage = [0.0] * _NUM_CODES
            remaining = self._remaining
            for i, (rate, left, code) in enumerate(zip(self._rate, remaining, self._stage)):
                sent = rate * dt
                if not sent <= left:
                    sent = left
                remaining[i] = left - sent
                by_stage[code] += sent
            self._add_delivered(by_stage)
        if self._load_idle or not self._track_load:
            return  # nothing ever loaded a link (or nobody reads it): the average stays 0
        # load <- util + (load - util) * decay: where util is 0 that is
        # load * decay, the same float result, done in one pass in place.
        decay = math.exp(-dt / self.load_window)
        load, links, util = self._link_load, self._util_links, self._util
        old = load[links]
        load *= decay
        load[links] = util + (old - util) * decay

    def _add_delivered(self, by_stage: list[float]) -> None:
        delivered = self.bytes_delivered_by_stage
        for code, stage in _STAGE_ITEMS:
            delivered[stage] += by_stage[code]

    def _schedule_recompute(self) -> None:
        now = self.queue.now
        if self._recompute_at != now:
            self._recompute_at = now
            self.queue.push(now, Priority.RECOMPUTE, self._on_recompute)

    # -- events ---------------------------------------------------------------

    def _finished(self, now: float) -> list[int]:
        """Positions of the live flows whose last bytes are in at ``now``."""
        if len(self._rate) >= VECTOR_FROM:
            remaining = np.array(self._remaining)
            done = (remaining <= np.array(self._size) * DONE_REL_EPS) | (
                remaining <= np.array(self._rate) * DONE_TIME_EPS * max(1.0, abs(now))
            )
            done &= ~np.array(self._dead, dtype=bool)
            return done.nonzero()[0].tolist()
        scale = max(1.0, abs(now))
        return [
            i
            for i, (left, size, rate, dead) in enumerate(zip(self._remaining, self._size, self._rate, self._dead))
            if not dead and (left <= size * DONE_REL_EPS or left <= rate * DONE_TIME_EPS * scale)
        ]

    def _on_completion(self, gen: int) -> None:
        if gen != self._completion_gen:
            return  # a later recompute moved the next completion
        self.events += 1
        now = self.queue.now
        self._advance(now)
        finished = self._finished(now)
        if not finished:
            self._schedule_completion()  # rounding left a sliver: go again
            return
        # Bytes still counted as remaining are delivered now.
        by_stage = [0.0] * _NUM_CODES
        remaining, rate, dead = self._remaining, self._rate, self._dead
        for i in finished:
            by_stage[self._stage[i]] += remaining[i]
            remaining[i] = 0.0
            rate[i] = 0.0
            dead[i] = True
        self._add_delivered(by_stage)
        self._gone.extend(finished)
        low = min([self._level[i] for i in finished])
        if low >= 0:
            self._removed_min_level = low if self._removed_min_level is None else min(self._removed_min_level, low)
        # (Link utilisation is refreshed by the recompute at this same time,
        # before any time passes.)
        # Callbacks may look at the network (live, rate_of), which compacts
        # the lists: take the flows out first.
        done_flows = [(self._flows[i], self._callbacks[i]) for i in finished]
        for flow, _ in done_flows:
            flow.finish = now
            self._members.discard(id(flow))
        for flow, callback in done_flows:
            self.policy.on_complete(flow, now)
            if callback is not None:
                callback(flow)
        self._schedule_recompute()

    def _on_timer(self, time: float) -> None:
        self._timers.discard(time)
        self.events += 1
        self._advance(self.queue.now)
        self._schedule_recompute()

    def _on_recompute(self) -> None:
        now = self.queue.now
        if self._recompute_at == now:
            self._recompute_at = None
        self.events += 1
        self._advance(now)
        self._compact()
        kept = len(self._flows)  # flows that had a decision; those admitted now follow them
        self._admit_pending()
        n = len(self._flows)
        if n == 0:
            self._util_links, self._util = np.zeros(0, dtype=np.int64), np.zeros(0)
            self._removed_min_level = None
            self._completion_gen += 1
            return
        snap = EngineSnapshot.of(self, now)
        decision = self.policy.decide(snap)
        snap.close()
        level_l, cap_l, queue_l, dscp_l = self._check(decision, n)
        old_level, old_cap, old_queue, old_dscp = self._level, self._cap, self._queue, self._dscp
        # Flows whose level or cap changed (new flows have level -1) need new
        # rates; those and flows whose queue or DSCP changed need their Flow
        # objects updated.
        if level_l[:kept] == old_level[:kept] and cap_l[:kept] == old_cap[:kept]:
            # The usual case: no earlier flow moved (list equality is the same
            # elementwise ==; caps are never NaN), only the new ones.
            moved = list(range(kept, n))
            if queue_l[:kept] == old_queue[:kept] and dscp_l[:kept] == old_dscp[:kept]:
                changed = moved
            else:
                changed = [i for i in range(n) if i >= kept or queue_l[i] != old_queue[i] or dscp_l[i] != old_dscp[i]]
        elif n >= VECTOR_FROM:
            level, cap = np.array(level_l, dtype=np.int64), np.array(cap_l, dtype=np.float64)
            queue, dscp = np.array(queue_l, dtype=np.int64), np.array(dscp_l, dtype=np.int64)
            moved_mask = (np.array(old_level) != level) | (np.array(old_cap) != cap)
            moved = moved_mask.nonzero()[0].tolist()
            changed = (moved_mask | (np.array(old_queue) != queue) | (np.array(old_dscp) != dscp)).nonzero()[0].tolist()
        else:
            moved = [i for i in range(n) if level_l[i] != old_level[i] or cap_l[i] != old_cap[i]]
            changed = [
                i for i in range(n)
                if level_l[i] != old_level[i] or cap_l[i] != old_cap[i] or queue_l[i] != old_queue[i]
                or dscp_l[i] != old_dscp[i]
            ]
        self._allocate(level_l, cap_l, moved)
        flows = self._flows
        for i in changed:
            flow = flows[i]
            flow.level = level_l[i]
            flow.cap = cap_l[i]
            flow.queue = queue_l[i]
            flow.dscp = dscp_l[i]
        self._level, self._cap, self._queue, self._dscp = level_l, cap_l, queue_l, dscp_l
        for t in decision.timers:
            if t > now and t not in self._timers and math.isfinite(t):
                self._timers.add(t)
                self.queue.push(t, Priority.TIMER, self._on_timer, t)
        self._schedule_completion()

    # -- recompute pieces -------------------------------------------------------

    def _check(self, decision: Decision, n: int) -> tuple[list, list, list, list]:
        """The decision's level, cap, queue and DSCP as lists, validated (one
        clear error naming the policy and field)."""
        name = type(self.policy).__name__
        level = decision.level
        if type(level) is not np.ndarray:
            level = np.asarray(level)
        if level.shape != (n,):
            raise ValueError(f"policy {name}: decision.level has shape {level.shape}, expected ({n},)")
        if level.dtype.kind not in "iu":
            if not np.all(np.isfinite(level)) or np.any(level != np.round(level)):
                raise ValueError(f"policy {name}: decision.level must be integers")
        if level.dtype != _I64:
            level = level.astype(np.int64)
        level_l = level.tolist()
        if min(level_l) < 0:
            raise ValueError(f"policy {name}: decision.level must be >= 0")
        if decision.cap is None:
            cap_l = [_INF] * n
        else:
            cap = np.asarray(decision.cap, dtype=np.float64)
            if cap.shape != (n,):
                raise ValueError(f"policy {name}: decision.cap has shape {cap.shape}, expected ({n},)")
            cap_l = cap.tolist()
            if not all(c >= 0 for c in cap_l):  # also catches NaN
                raise ValueError(f"policy {name}: decision.cap must be >= 0 (inf for none)")
        queue = decision.queue
        if type(queue) is not np.ndarray:
            queue = np.asarray(queue)
        if queue.shape != (n,) or queue.dtype.kind not in "iu" or min(queue_l := queue.tolist()) < 0:
            raise ValueError(f"policy {name}: decision.queue must be {n} integers >= 0 (one per flow)")
        dscp = decision.dscp
        if type(dscp) is not np.ndarray:
            dscp = np.asarray(dscp)
        if dscp.shape != (n,) or dscp.dtype != np.uint8 or max(dscp_l := dscp.tolist()) > 63:
            raise ValueError(f"policy {name}: decision.dscp must be {n} uint8 codepoints in 0..63 (one per flow)")
        return level_l, cap_l, queue_l, dscp_l

    def _allocate(self, level_l: list[int], cap_l: list[float], moved: list[int]) -> None:
        """Rates for the new decision, reusing the levels no change touched
        (``moved``: positions whose level or cap is not the last decision's)."""
        old = self._level
        touched = []
        if moved:
            touched.append(min([level_l[i] for i in moved]))
            prev = [old[i] for i in moved if old[i] >= 0]
            if prev:
                touched.append(min(prev))
        if self._removed_min_level is not None:
            touched.append(self._removed_min_level)
        self._removed_min_level = None
        if not touched:
            return  # same flows, levels and caps: same rates
        from_level = min(touched)
        if len(level_l) == 1 and not self._track_load:
            # One flow: what allocate computes (water_fill's one-flow case on
            # the full capacities: the smallest capacity / weight, which is
            # the bottleneck rate, then max(0, min(it, cap))), or its kept rate
            # when its level is below every touched one.
            if from_level <= level_l[0]:
                share, c = self._bneck[0], cap_l[0]
                m = c if c < share else share
                self._rate = [m if m > 0.0 else 0.0]
            return
        usage = self._usage()
        rate = allocate_lists(self._capacity_buf, usage, level_l, cap_l, from_level, self._rate)
        if rate is None:  # no C module (or it refused): the same rates from NumPy
            rate = allocate(self.capacity, usage, np.array(level_l, dtype=np.int64), np.array(cap_l, dtype=np.float64),
                            from_level=from_level, prev_rate=np.array(self._rate)).tolist()
        self._rate = rate
        if not self._track_load:
            return
        # Per entry (a link may repeat: the same value is then written twice).
        self._util_links = usage.link
        self._util = usage.entry_utilization(np.array(rate), self.capacity)
        self._load_idle = False

    def _usage(self) -> Usage:
        """The live flows' usage vectors as one CSR (cached until the live set changes)."""
        if self._csr is None:
            links, weights = self._links, self._weights
            key = None
            if len(links) <= _CSR_CACHE_UP_TO:
                # A few flows: the same sets of transfer shapes come back (a
                # unit's collective beside its P2D flows, layer after layer),
                # so their CSR is kept by the usage arrays' ids. The entry
                # holds the arrays, so the ids cannot be reused while it lives.
                key = (*map(id, links), *map(id, weights))
                hit = self._csr_cache.get(key)
                if hit is not None:
                    self._csr = hit[0]
                    return hit[0]
            ptr = np.array(list(accumulate(self._nnz, initial=0)), dtype=np.int64)
            self._csr = Usage(ptr, np.concatenate(links), np.concatenate(weights))
            if key is not None:
                if len(self._csr_cache) >= 4096:
                    self._csr_cache.clear()
                self._csr_cache[key] = (self._csr, list(links), list(weights))
        return self._csr

    def _schedule_completion(self) -> None:
        self._completion_gen += 1
        if len(self._rate) >= VECTOR_FROM:
            rate = np.array(self._rate)
            moving = (rate > 0).nonzero()[0]
            times = (np.array(self._remaining)[moving] / rate[moving]).tolist()
            if not times:
                return
        elif self._rate and 0.0 not in self._rate:  # every flow moves (rates are >= 0): no filter needed
            times = map(truediv, self._remaining, self._rate)
        else:
            times = [left / rate for left, rate in zip(self._remaining, self._rate) if rate > 0]
            if not times:
                return
        self.queue.push(self.queue.now + min(times), Priority.COMPLETION, self._on_completion, self._completion_gen)

    # -- live-set bookkeeping -----------------------------------------------------

    _COLUMNS = ("_flows", "_callbacks", "_remaining", "_rate", "_size", "_arrival", "_stage", "_bneck", "_links",
                "_weights", "_nnz", "_dead", "_level", "_cap", "_queue", "_dscp")

    def _compact(self) -> None:
        """Drop finished flows from the lists (order kept)."""
        gone = self._gone
        if not gone:
            return
        gone.sort(reverse=True)
        u = self._csr
        block = gone[0] - gone[-1] == len(gone) - 1  # one run of positions (gone has no repeats)
        if u is not None and len(self._nnz) >= _CSR_CUT_FROM and block:
            # Many flows, the finished ones side by side: cut their entries
            # out of the CSR by slicing.
            a, b = gone[-1], gone[0] + 1
            ea, eb = int(u.ptr[a]), int(u.ptr[b])
            self._csr = Usage(np.concatenate((u.ptr[:a], u.ptr[b:] - (eb - ea))),
                              np.concatenate((u.link[:ea], u.link[eb:])), np.concatenate((u.weight[:ea], u.weight[eb:])))
        elif u is not None and len(self._nnz) >= _CSR_CUT_FROM:
            # Many flows: cut the finished ones' entries out of the CSR in a
            # few passes rather than rebuilding it from every flow's arrays.
            keep = np.ones(len(self._nnz), dtype=bool)
            keep[gone] = False
            counts = np.array(self._nnz, dtype=np.int64)
            entry_keep = np.repeat(keep, counts)
            ptr = np.zeros(len(self._nnz) - len(gone) + 1, dtype=np.int64)
            np.cumsum(counts[keep], out=ptr[1:])
            self._csr = Usage(ptr, u.link[entry_keep], u.weight[entry_keep])
        else:
            self._csr = None
        if len(gone) == 1:  # the usual case, without the getattr per column
            i = gone[0]
            del self._flows[i], self._callbacks[i], self._remaining[i], self._rate[i], self._size[i]
            del self._arrival[i], self._stage[i], self._bneck[i], self._links[i], self._weights[i], self._nnz[i]
            del self._dead[i], self._level[i], self._cap[i], self._queue[i], self._dscp[i]
        elif block:
            # One block (flows admitted together, such as a batch's P2D
            # flows of one layer, often finish together): one slice per column.
            a, b = gone[-1], gone[0] + 1
            for name in self._COLUMNS:
                del getattr(self, name)[a:b]
        elif len(gone) > 8:  # many, scattered: each column rebuilt once
            drop = set(gone)
            keep = [i for i in range(len(self._flows)) if i not in drop]
            for name in self._COLUMNS:
                column = getattr(self, name)
                setattr(self, name, [column[i] for i in keep])
        else:
            for name in self._COLUMNS:
                column = getattr(self, name)
                for i in gone:
                    del column[i]
        gone.clear()
        self._pos = None

    def _admit_pending(self) -> None:
        """Append the flows added since the last recompute to the live lists."""
        pending = self._pending
        if not pending:
            return
        k = len(pending)
        if k == 1:
            # The common case: one flow, appended column by column. A few
            # flows' CSR is found again by _usage; many flows' is appended to.
            flow, callback, links, weights, bneck = pending[0]
            u = self._csr
            if u is not None and len(self._nnz) >= _CSR_CUT_FROM:
                self._csr = Usage(np.concatenate((u.ptr, (int(u.ptr[-1]) + links.size,))),
                                  np.concatenate((u.link, links)), np.concatenate((u.weight, weights)))
            else:
                self._csr = None
            size = float(flow.size)
            self._flows.append(flow)
            self._callbacks.append(callback)
            self._remaining.append(size)
            self._size.append(size)
            self._rate.append(0.0)
            self._arrival.append(float(flow.arrival))
            self._stage.append(STAGE_CODES[flow.stage])
            self._bneck.append(bneck)
            self._links.append(links)
            self._weights.append(weights)
            self._nnz.append(links.size)
            self._dead.append(False)
            self._level.append(-1)
            self._cap.append(_INF)
            self._queue.append(-1)
            self._dscp.append(0)
            pending.clear()
            self._pos = None
            return
        flows = [p[0] for p in pending]
        self._flows.extend(flows)
        self._callbacks.extend([p[1] for p in pending])
        size = [float(f.size) for f in flows]
        self._remaining.extend(size)
        self._size.extend(size)
        self._rate.extend([0.0] * k)
        self._arrival.extend([float(f.arrival) for f in flows])
        self._stage.extend([STAGE_CODES[f.stage] for f in flows])
        self._bneck.extend([p[4] for p in pending])
        self._links.extend([p[2] for p in pending])
        self._weights.extend([p[3] for p in pending])
        self._nnz.extend([p[2].size for p in pending])
        u = self._csr
        if u is not None:  # append the new flows' entries
            ends = u.ptr[-1] + np.cumsum([p[2].size for p in pending])
            self._csr = Usage(
                np.concatenate([u.ptr, ends]),
                np.concatenate([u.link] + [p[2] for p in pending]),
                np.concatenate([u.weight] + [p[3] for p in pending]),
            )
        self._dead.extend([False] * k)
        self._level.extend([-1] * k)
        self._cap.extend([_INF] * k)
        self._queue.extend([-1] * k)
        self._dscp.extend([0] * k)
        pending.clear()
        self._pos = None


def _merge_links(flow: Flow, num_links: int) -> tuple[np.ndarray, np.ndarray]:
    """The flow's usage vector with repeated links summed and zero weights dropped."""
    links, weights = flow.links, flow.weights
    # Python min/max over the (short) lists: NumPy reductions cost more here.
    link_list, weight_list = links.tolist(), weights.tolist()
    if min(link_list) < 0 or max(link_list) >= num_links:
        raise ValueError(f"flow {flow.id!r}: link index out of range (topology has {num_links} links)")
    if not all(0 <= w < math.inf for w in weight_list):
        raise ValueError(f"flow {flow.id!r}: weights must be finite and >= 0")
    low = min(weight_list)
    if links.size > 1:
        if len(set(link_list)) < len(link_list):
            merged = np.bincount(links, weights=weights, minlength=num_links)
            links = np.flatnonzero(merged > 0)
            weights = merged[links]
            low = weights.min() if weights.size else 0.0
    if low <= 0:
        keep = weights > 0
        if not keep.any():
            raise ValueError(f"flow {flow.id!r}: usage vector has no positive weight")
        links, weights = links[keep], weights[keep]
    return links.astype(np.int64, copy=False), weights.astype(np.float64, copy=False)


class EngineSnapshot(Snapshot):
    """The engine's :class:`Snapshot`: each array column is copied from the
    engine's live arrays the first time the policy reads it.

    Built by :meth:`FluidNetwork._snapshot` for one ``decide`` call; the
    columns are only valid during that call (the engine's arrays move on
    after it), so reading one that was never read before afterwards raises
    rather than returning later numbers. ``link_load`` raises if the engine
    does not keep it (the policy said ``reads_link_load = False``).
    """

    @classmethod
    def of(cls, net: FluidNetwork, now: float) -> "EngineSnapshot":
        snap = cls.__new__(cls)
        d = snap.__dict__
        d["now"] = now
        d["flows"] = list(net._flows)  # a copy: the engine edits its list in place
        d["capacity"] = net.capacity
        d["load_window"] = net.load_window
        d["_net"] = net
        return snap

    def close(self) -> None:
        """Called by the engine when ``decide`` returned."""
        self.__dict__["_net"] = None

    def _engine(self) -> FluidNetwork:
        net = self.__dict__.get("_net")  # (absent in a copy made by dataclasses.replace)
        if net is None:
            raise RuntimeError("an engine snapshot's columns can only be read first during decide()")
        return net

    @cached_property
    def remaining(self) -> np.ndarray:  # type: ignore[override]
        return np.array(self._engine()._remaining, dtype=np.float64)

    @cached_property
    def link_load(self) -> np.ndarray:  # type: ignore[override]
        # Clipped to [0, 1] (float dust in the utilization), at a third of np.clip's cost.
        return np.minimum(np.maximum(self._engine().link_load, 0.0), 1.0)

    @cached_property
    def size(self) -> np.ndarray:
        return np.array(self._engine()._size, dtype=np.float64)

    @cached_property
    def arrival(self) -> np.ndarray:
        return np.array(self._engine()._arrival, dtype=np.float64)

    @cached_property
    def stage(self) -> np.ndarray:
        return np.array(self._engine()._stage, dtype=np.int8)

    @cached_property
    def bottleneck_rate(self) -> np.ndarray:
        return np.array(self._engine()._bneck, dtype=np.float64)
