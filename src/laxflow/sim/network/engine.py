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

The policy is asked through ``decide`` on an :class:`EngineSnapshot`. For
a policy with ``FlowPolicy.keeps_tags`` (mfs) the snapshot is incremental:
``remaining`` and ``link_load_in_use`` are read-only views of the table's
columns, ``kept`` says how many flows had the last decision, ``progressed``
whose progress changed, and ``tag`` is the table's ``tag`` column, where
the engine stores each decision's ``Decision.tag``. Such a policy reads
request progress (``Flow.current_layer``, ``compute_done``) only after the
owner called :meth:`FluidNetwork.reschedule`, so an owner that changes
progress must call it (a layer boundary, the end of compute), naming the
flows it changed when it knows them (then only theirs is read).

Every per-flow number (bytes left, rate, the last decision, the usage
vectors as one CSR) lives in a C table (``table_native.c``, built with the
allocator at install), which also runs the per-event passes over them:
bytes sent since the last event, the link-load average, finished flows, the
next completion, what a decision moved, and the rate allocation (see
:mod:`~laxflow.sim.network.allocator`; with its C path switched off the
rates come from NumPy, bit-identical). The Flow objects, their callbacks and
the events stay here. Flows that finish are dropped before the next
decision.

``Snapshot.link_load`` is an exponentially weighted moving average of each
link's utilization (used bytes/s over capacity) with time constant
``load_window`` seconds (stated in ``Snapshot.load_window``; MFS checks it): over an interval dt at constant utilization u,
``load <- u + (load - u) * exp(-dt / load_window)``. That is exact for the
engine's piecewise-constant rates. The links some live flow uses are brought
forward at every event (their u as the last allocation left it); a link
no flow uses has u = 0 until one arrives on it, and is brought forward over
that whole span at once (one exp) when a flow arrives on it or its average is
read: per event, the work is over the links in use, not over the fabric.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.flow import STAGE_CODES, STAGE_OF_CODE, Flow, Stage
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network import allocator
from laxflow.sim.network.allocator import SATURATED_REL_EPS, Usage, allocate
from laxflow.sim.network.topology import Topology

try:  # the live-flow table in C (table_native.c), built at install with the allocator
    from laxflow.sim.network._allocate_native import ffi as _ffi, lib as _lib
except ImportError:  # pragma: no cover - an install without the build
    _ffi = _lib = None

# A flow with at most this fraction of its bytes left is done: flows that end
# at the same time in exact arithmetic then complete at the same event.
DONE_REL_EPS = 1e-9
# ... and so is one whose last bytes would take less than this (relative to
# now) to send: its finish time is not representable as later than now.
DONE_TIME_EPS = 1e-12
_STAGE_ITEMS = tuple(STAGE_OF_CODE.items())
_INF = math.inf
_I64 = np.dtype(np.int64)
_F64 = np.dtype(np.float64)
_U8 = np.dtype(np.uint8)
_INT64S, _DOUBLES, _UINT8S = "int64_t[]", "double[]", "uint8_t[]"  # C types of the decision's arrays
_COMPLETION = int(Priority.COMPLETION)
_REL_BELOW, _REL_ABOVE = 1.0 - allocator.REL_EPS, 1.0 + allocator.REL_EPS  # as the allocator computes them

Callback = Callable[[Flow], None]


class FluidNetwork:
    """Flow-level network: strict priority across levels, max-min fair inside one.

    One instance per simulated network, driven by the owner's event loop on
    one thread. The owner shares ``queue`` (it pushes its own events onto it)
    and either calls :meth:`run` or steps the queue itself. ``load_window``
    (seconds, default 10 ms: a few layers of a prefill) is the time constant
    of ``Snapshot.link_load``, which is kept when the policy reads it
    (``FlowPolicy.reads_link_load``) or ``track_link_load`` is True.
    With ``flow_fields`` (the default) each decision's ``level``, ``cap``,
    ``queue`` and ``dscp`` are written to the live Flow objects where they
    changed; an owner that never reads them (the serving simulator, whose
    MFS runs shift most flows' dense levels at every batch's arrival and
    departure) passes False and saves those stores: the table holds the
    decision either way, and rates and finish times are the same.
    """

    def __init__(
        self,
        topology: Topology,
        policy: FlowPolicy,
        queue: EventQueue | None = None,
        load_window: float = 0.01,
        track_link_load: bool | None = None,
        flow_fields: bool = True,
    ) -> None:
        if not load_window > 0:
            raise ValueError(f"load_window must be > 0 s (got {load_window!r})")
        if _lib is None:
            raise RuntimeError(
                "the network engine's C part (laxflow.sim.network._allocate_native) is not built: "
                "reinstall laxflow with a C compiler (make install)"
            )
        self.topology = topology
        self.policy = policy
        self.queue = queue if queue is not None else EventQueue()
        self.load_window = float(load_window)
        self.capacity = topology.capacity
        self._capacity_list = self.capacity.tolist()
        # The moving average is kept only when someone reads it: the policy
        # (``reads_link_load``) or the owner (``track_link_load=True``).
        self._track_load = policy.reads_link_load if track_link_load is None else bool(track_link_load)
        self._flow_fields = bool(flow_fields)  # decisions written back to the Flow objects
        policy.flow_notes = self._flow_fields  # (and the policy's own notes on them: FlowPolicy.flow_notes)
        capacity = np.ascontiguousarray(self.capacity, dtype=np.float64)
        table = _lib.lxf_table_new(capacity.size, _ffi.from_buffer("double[]", capacity), self._track_load,
                                   self.load_window)
        if table == _ffi.NULL:
            raise MemoryError("no memory for the network's flow table")
        self._table = _ffi.gc(table, _lib.lxf_table_free)
        self.events = 0  # engine events handled (completions, timers, recomputes)
        # policy.on_complete, or None when the policy does not override FlowPolicy's no-op.
        self._policy_on_complete = None if type(policy).on_complete is FlowPolicy.on_complete else policy.on_complete

        # Live flows in admission order, as the table's rows (which hold every number).
        self._flows: list[Flow] = []
        self._callbacks: list[Callback | None] = []
        self._gone: list[int] = []  # positions of finished flows, until the next compaction
        self._pending: list[tuple] = []  # (flow, callback, links, weights, entries, bottleneck rate)
        self._ints = _ffi.new("int64_t[]", 64)  # out-buffer of positions for the table (grown as needed)
        self._ints_room = 64
        self._out = _ffi.new("int64_t[4]")  # small out-values of the table's calls
        self._next = _ffi.new("double[1]")  # time to the next completion (-1: none)
        self._cdata_cache: dict[tuple, tuple] = {}  # C buffers of checked read-only decision arrays, by (id, C type)
        # Merged usage of read-only (links, weights) arrays, by their ids
        # (_merge_usage). The value holds the arrays themselves, so their ids
        # cannot be reused.
        self._usage_cache: dict[tuple[int, int], tuple] = {}
        self._t = self.queue.now  # time up to which bytes are accounted
        self._recompute_at: float | None = None
        self._completion_gen = 0
        self._timers: set[float] = set()
        self._pos: dict[int, int] | None = None
        self._members: set[int] = set()  # id() of live and pending flows
        # The incremental snapshot (FlowPolicy.keeps_tags): read-only views of the
        # table's remaining and tag columns (made again when the columns move, as
        # their room grows) and of its link-load average.
        self._keeps_tags = bool(policy.keeps_tags)
        self._table_room = -1
        self._views: tuple = ()
        self._load_view = _view(table.load, self.capacity.size, _F64)
        # C buffers of the decisions such a policy handed out, by id (each entry
        # holds the Decision and its arrays): one it hands out again is not checked again.
        self._decisions: dict[int, tuple] = {}
        # Whose progress changed since the last decision (Snapshot.progressed):
        # True, any flow's (reschedule()); a list, those flows' (reschedule(flows)); False, none.
        self._progressed: bool | list[Flow] = True
        self._snap: EngineSnapshot | None = None  # the incremental snapshot (_decide_incremental)

    # -- owner API --------------------------------------------------------------

    @property
    def link_load(self) -> np.ndarray:
        """Per-link utilization EWMA now (see the module doc); a new array per call."""
        self._check_load_kept()
        out = np.empty(self.capacity.size)
        _lib.lxf_table_load_now(self._table, _ffi.from_buffer("double[]", out))
        return out

    def _check_load_kept(self) -> None:
        if not self._track_load:
            raise RuntimeError(
                f"link_load is not kept: policy {type(self.policy).__name__} does not read it "
                "(pass track_link_load=True to FluidNetwork to keep it)"
            )

    @property
    def bytes_delivered_by_stage(self) -> dict[Stage, float]:
        """Bytes delivered so far per stage (a new dict per call)."""
        delivered = self._table.delivered
        return {stage: delivered[code] for code, stage in _STAGE_ITEMS}

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
        if not 0 < flow.size < _INF:  # (NaN fails too)
            raise ValueError(f"flow {flow.id!r}: size must be finite and > 0 (got {flow.size!r})")
        # A frozen transfer shape's merged usage is cached (see _merge_usage):
        # the entry holds these very arrays, so their ids are theirs.
        links, weights = flow.links, flow.weights
        hit = self._usage_cache.get((id(links), id(weights)))
        usage = hit[2] if hit is not None and not (links.flags.writeable or weights.flags.writeable) \
            else self._merge_usage(flow)
        if flow.arrival < now:
            flow.arrival = now
        if now > self._t:
            self._advance(now)
        self._pending.append((flow, on_complete, *usage))
        self._members.add(id(flow))
        if self._recompute_at != now:
            self._schedule_recompute()

    def reschedule(self, flows: Iterable[Flow] | None = None) -> None:
        """Ask the policy again at ``queue.now`` (the owner changed request state).

        Called by the owner after it changed live flows' request progress
        (``current_layer``, ``compute_done``): a policy deciding into the
        engine (``keeps_tags``) reads progress again only then, of
        ``flows`` if the owner names them (every flow whose progress it
        changed), else of every live flow.
        """
        progressed = self._progressed
        if flows is None or not self._keeps_tags:  # (a policy deciding on snapshots reads all progress anyway)
            self._progressed = True
        elif progressed is not True:
            if progressed:
                progressed.extend(flows)
            else:
                self._progressed = list(flows)
        now = self.queue.now
        if now > self._t:
            self._advance(now)
        if self._recompute_at != now:
            self._schedule_recompute()

    def _merge_usage(self, flow: Flow) -> tuple:
        """The flow's merged usage vector (as C arrays), its entry count and
        its bottleneck rate alone (min of capacity / weight); kept for
        read-only (links, weights) arrays: the serving simulator gives every
        flow of one transfer shape the same frozen arrays, so each shape is
        merged and checked once."""
        links, weights = flow.links, flow.weights
        merged, merged_w = _merge_links(flow, self.topology.num_links)
        capacity = self._capacity_list
        bneck = min([capacity[link] / w for link, w in zip(merged.tolist(), merged_w.tolist())])
        # (from_buffer keeps the arrays alive as long as the C views live)
        usage = (_ffi.from_buffer("int64_t[]", merged), _ffi.from_buffer("double[]", merged_w), merged.size, bneck)
        if not (links.flags.writeable or weights.flags.writeable):
            if len(self._usage_cache) >= 4096:  # bounded: many distinct frozen arrays is not the serving case
                self._usage_cache.clear()
            self._usage_cache[(id(links), id(weights))] = (links, weights, usage)
        return usage

    def _position(self, flow: Flow) -> int | None:
        self._compact()
        if self._pos is None:
            self._pos = {id(f): i for i, f in enumerate(self._flows)}
        return self._pos.get(id(flow))

    def rate_of(self, flow: Flow) -> float:
        """Current rate of ``flow`` in bytes/s (0 if not live or not yet allocated)."""
        i = self._position(flow)
        return 0.0 if i is None else float(self._table.rate[i])

    def remaining_of(self, flow: Flow) -> float:
        """Bytes ``flow`` still has to send at ``queue.now``."""
        self._advance(self.queue.now)
        i = self._position(flow)
        if i is not None:
            return float(self._table.remaining[i])
        return float(flow.size) if id(flow) in self._members else 0.0  # pending: nothing sent yet

    def run(self, until: float = float("inf")) -> int:
        """Run the shared queue until ``until``; returns how many events ran."""
        return self.queue.run(until)

    # -- time ---------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Account bytes and link load from the last event up to ``now``."""
        dt = now - self._t
        if dt > 0:
            self._t = now
            _lib.lxf_table_advance(self._table, dt, now)

    def _schedule_recompute(self) -> None:
        now = self.queue.now
        if self._recompute_at != now:
            self._recompute_at = now
            self.queue.push(now, Priority.RECOMPUTE, self._on_recompute)

    def _int_buffer(self, n: int):
        """The out-buffer of positions, with room for ``n``."""
        if n > self._ints_room:
            self._ints_room = max(n, 2 * self._ints_room)
            self._ints = _ffi.new("int64_t[]", self._ints_room)
        return self._ints

    # -- events ---------------------------------------------------------------

    def _on_completion(self, gen: int) -> None:
        if gen != self._completion_gen:
            return  # a later recompute moved the next completion
        self.events += 1
        now = self.queue.now
        self._advance(now)
        # The flows whose last bytes are in: the table delivers what they
        # still counted as remaining and marks them done.
        out = self._int_buffer(len(self._flows))
        k = _lib.lxf_table_complete(self._table, now, DONE_REL_EPS, DONE_TIME_EPS, out, self._out)
        if not k:
            self._schedule_completion(_lib.lxf_table_next(self._table))  # rounding left a sliver: go again
            return
        finished = _ffi.unpack(out, k)
        self._gone.extend(finished)
        # (Link utilisation is refreshed by the recompute at this same time,
        # before any time passes.)
        # Callbacks may look at the network (live, rate_of), which compacts
        # the lists: take the flows out first.
        flows, callbacks, members = self._flows, self._callbacks, self._members
        done_flows = [(flows[i], callbacks[i]) for i in finished]
        for flow, _ in done_flows:
            flow.finish = now
            members.discard(id(flow))
        on_complete = self._policy_on_complete  # None: the policy keeps FlowPolicy's no-op
        for flow, callback in done_flows:
            if on_complete is not None:
                on_complete(flow, now)
            if callback is not None:
                callback(flow)
        self._recompute_after_event()

    def _on_timer(self, time: float) -> None:
        self._timers.discard(time)
        self.events += 1
        self._advance(self.queue.now)
        self._recompute_after_event()

    def _recompute_after_event(self) -> None:
        """The recompute this event calls for: run in place when no other
        event is due at this time (it would be the next one popped, so the
        order of handlers is the same), else pushed to run after them."""
        now = self.queue.now
        if self._recompute_at == now:
            return
        if self.queue.nothing_else_now():
            self._recompute_at = now
            self._on_recompute()
        else:
            self._schedule_recompute()

    def _on_recompute(self) -> None:
        now = self.queue.now
        if self._recompute_at == now:
            self._recompute_at = None
        self.events += 1
        if now > self._t:
            self._advance(now)
        if self._gone:
            self._compact()
        kept = len(self._flows)  # flows that had a decision; those admitted now follow them
        if self._pending:
            self._admit_pending()
        n = len(self._flows)
        if n == 0:
            _lib.lxf_table_idle(self._table)
            self._completion_gen += 1
            return
        args = None
        if self._keeps_tags:
            decision = self._decide_incremental(now, kept, n)
            hit = self._decisions.get(id(decision))
            if hit is not None and hit[0] is decision and hit[1] is decision.level and hit[2] is decision.queue \
                    and hit[3] is decision.dscp and hit[4] is decision.tag and decision.cap is None \
                    and len(hit[1]) == n:
                # (a Decision handed out again with the same arrays: their C buffers again)
                args = hit[5]
                if hit[6] is not None:
                    _ffi.memmove(self._table.tag, hit[6], 8 * n)
            else:
                args = self._first_sight(decision, n)
        else:
            snap = EngineSnapshot.of(self, now)
            try:
                decision = self.policy.decide(snap)
            finally:  # (its columns are never read first after decide, even if the policy raised)
                snap.close()
            if decision.tag is not None:
                self._store_tags(decision.tag, n)
        level, queue, dscp, cap, timers = decision.level, decision.queue, decision.dscp, decision.cap, \
            decision.timers
        if args is None:
            known = self._cdata_cache
            hl, hq = known.get((id(level), _INT64S)), known.get((id(queue), _INT64S))
            hd = known.get((id(dscp), _UINT8S))
            if hl is not None and hq is not None and hd is not None and cap is None \
                    and len(level) == n and len(queue) == n and len(dscp) == n:
                # Read-only arrays that passed _check before as they are (a
                # policy's cached decision): their C buffers again.
                args = (hl[1], _ffi.NULL, hq[1], hd[1])
            else:
                level, cap, queue, dscp = self._check(decision, n)
                cdata = self._cdata
                args = (cdata(_INT64S, level), _ffi.NULL if cap is None else cdata(_DOUBLES, cap),
                        cdata(_INT64S, queue), cdata(_UINT8S, dscp))
        # The table checks the values, stores the decision, says which
        # positions changed (their Flow objects are updated here), recomputes
        # the rates from the lowest level that changed (levels below it keep
        # theirs, which is exact: see allocator.allocate) and gives the time
        # to the next completion.
        changed_buf = self._ints if 3 * n <= self._ints_room else self._int_buffer(3 * n)
        out, table, native = self._out, self._table, allocator.NATIVE
        rc = _lib.lxf_table_apply(table, kept, *args, changed_buf, out, native, _REL_BELOW, _REL_ABOVE,
                                  SATURATED_REL_EPS, self._next)
        if rc:
            if rc == -1:
                raise MemoryError("no memory for the rate allocation")
            self._bad_decision(rc)
        if not native:
            if out[1] >= 0:
                self._allocate_numpy(out[1])
            self._next[0] = _lib.lxf_table_next(table)
        # The Flow objects' copies of the decision, where they changed (often
        # only levels: a new batch shifts the dense ranks of many flows).
        if self._flow_fields:
            self._write_flow_fields(n, out, changed_buf, level, cap, queue, dscp)
        for t in timers:
            if t > now and t not in self._timers and math.isfinite(t):
                self._timers.add(t)
                self.queue.push(t, Priority.TIMER, self._on_timer, t)
        self._schedule_completion(self._next[0])

    def _write_flow_fields(self, n: int, out, changed_buf, level, cap, queue, dscp) -> None:
        """The decision just stored, on the Flow objects where it changed (``out``
        and ``changed_buf``: lxf_table_apply's counts and positions)."""
        flows = self._flows
        if out[0]:
            if 2 * out[0] > n:  # every flow's, without the positions (a new level shifts the dense ranks above it)
                for flow, value in zip(flows, level.tolist()):
                    flow.level = value
            else:  # a few changed (new flows): their values, not the whole list
                level_at = level.item if 4 * out[0] < n else level.tolist().__getitem__
                for i in _ffi.unpack(changed_buf, out[0]):
                    flows[i].level = level_at(i)
        if out[2]:
            cap_l = [_INF] * n if cap is None else cap.tolist()
            for i in _ffi.unpack(changed_buf + n, out[2]):
                flows[i].cap = cap_l[i]
        if out[3]:
            if 4 * out[3] < n:  # a few changed (new flows): their values, not whole lists
                queue_at, dscp_at = queue.item, dscp.item
            else:
                queue_at, dscp_at = queue.tolist().__getitem__, dscp.tolist().__getitem__
            for i in _ffi.unpack(changed_buf + 2 * n, out[3]):
                flow = flows[i]
                flow.queue = queue_at(i)
                flow.dscp = dscp_at(i)

    def _decide_incremental(self, now: float, kept: int, n: int) -> Decision:
        """The policy's decision on the incremental snapshot (``FlowPolicy.keeps_tags``):
        read-only views of the table's columns, the engine's list of flows,
        ``kept``, whose progress changed; its ``tag`` stored in the table."""
        table = self._table
        if table.room != self._table_room:  # the columns moved (their room grew): views of them again
            self._table_room = table.room
            self._views = (_view(table.remaining, table.room, _F64), _view(table.tag, table.room, _I64))
        remaining, tag = self._views
        snap = self._snap
        if snap is None:  # (one per engine: each decision sets its fields; they are valid during decide only)
            snap = self._snap = EngineSnapshot.__new__(EngineSnapshot)
            snap.__dict__.update(capacity=self.capacity, load_window=self.load_window,
                                 link_load_in_use=self._load_view)
        d = snap.__dict__
        d["now"], d["flows"], d["_net"], d["kept"], d["progressed"] = now, self._flows, self, kept, self._progressed
        d["remaining"], d["tag"] = remaining[:n], tag[:n]
        self._progressed = False
        try:
            return self.policy.decide(snap)
        finally:  # (its columns are never read first after decide, even if the policy raised: snap.close())
            d["_net"] = None
            if len(d) > len(_INCREMENTAL_FIELDS):  # columns it read and kept: read again at the next decision
                for name in [name for name in d if name not in _INCREMENTAL_FIELDS]:
                    del d[name]

    def _first_sight(self, decision: Decision, n: int) -> tuple | None:
        """A decision on the incremental snapshot not seen before: its ``tag``
        stored, and, when its arrays are of the table's types and shape (as
        such a policy hands them: _check's checks without its work), the
        table's arguments for them, kept by the Decision's id (the entry
        holds it) so that the same Decision handed out again with the same
        arrays is not checked again; else None (the general path)."""
        tag = decision.tag
        if tag is not None:
            self._store_tags(tag, n)
        level, queue, dscp = decision.level, decision.queue, decision.dscp
        if decision.cap is None and type(level) is type(queue) is type(dscp) is np.ndarray \
                and level.dtype is _I64 and queue.dtype is _I64 and dscp.dtype is _U8 \
                and level.shape == queue.shape == dscp.shape == (n,) and level.flags.c_contiguous \
                and queue.flags.c_contiguous and dscp.flags.c_contiguous \
                and (tag is None or tag.flags.c_contiguous):
            args = (_ffi.from_buffer(_INT64S, level), _ffi.NULL, _ffi.from_buffer(_INT64S, queue),
                    _ffi.from_buffer(_UINT8S, dscp))
            if len(self._decisions) >= 4096:
                self._decisions.clear()
            self._decisions[id(decision)] = (decision, level, queue, dscp, tag, args,
                                             None if tag is None else _ffi.from_buffer(_INT64S, tag))
            return args
        return None

    def _store_tags(self, tag: np.ndarray, n: int) -> None:
        """A decision's ``tag`` into the table's tag column (checked: n int64)."""
        if type(tag) is not np.ndarray or tag.shape != (n,) or tag.dtype != _I64:
            raise ValueError(f"policy {type(self.policy).__name__}: decision.tag must be {n} int64 (one per flow)")
        _ffi.memmove(self._table.tag, tag if tag.flags.c_contiguous else np.ascontiguousarray(tag), 8 * n)

    def _cdata(self, ctype: str, a: np.ndarray):
        """The (checked) array's buffer for C; kept for read-only contiguous
        arrays by (id, C type), with the array held so its id is not reused:
        a policy's cached decision comes back call after call, and is then
        known to have passed _check as it is."""
        if a.flags.writeable:
            return _buffer(ctype, a)
        key = (id(a), ctype)
        hit = self._cdata_cache.get(key)
        if hit is not None:
            return hit[1]
        try:
            c = _ffi.from_buffer(ctype, a)
        except ValueError:  # not contiguous: a copy, not kept (its source could change)
            return _buffer(ctype, a)
        if len(self._cdata_cache) >= 256:
            self._cdata_cache.clear()
        self._cdata_cache[key] = (a, c)
        return c

    # -- recompute pieces -------------------------------------------------------

    def _check(self, decision: Decision, n: int) -> tuple:
        """The decision's level, cap (None: no caps), queue and DSCP as
        arrays of the table's types, their shapes and types checked (one
        clear error naming the policy and field); the table checks the values."""
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
        cap = decision.cap
        if cap is not None:
            cap = np.asarray(cap, dtype=np.float64)
            if cap.shape != (n,):
                raise ValueError(f"policy {name}: decision.cap has shape {cap.shape}, expected ({n},)")
        queue = decision.queue
        if type(queue) is not np.ndarray:
            queue = np.asarray(queue)
        if queue.shape != (n,) or queue.dtype.kind not in "iu":
            self._bad_decision(_lib.LXF_BAD_QUEUE)
        if queue.dtype != _I64:
            queue = queue.astype(np.int64)
        dscp = decision.dscp
        if type(dscp) is not np.ndarray:
            dscp = np.asarray(dscp)
        if dscp.shape != (n,) or dscp.dtype != _U8:
            self._bad_decision(_lib.LXF_BAD_DSCP)
        return level, cap, queue, dscp

    def _bad_decision(self, rc: int) -> None:
        name, n = type(self.policy).__name__, len(self._flows)
        message = {
            _lib.LXF_BAD_LEVEL: "decision.level must be >= 0",
            _lib.LXF_BAD_CAP: "decision.cap must be >= 0 (inf for none)",
            _lib.LXF_BAD_QUEUE: f"decision.queue must be {n} integers >= 0 (one per flow)",
            _lib.LXF_BAD_DSCP: f"decision.dscp must be {n} uint8 codepoints in 0..63 (one per flow)",
        }
        raise ValueError(f"policy {name}: {message[rc]}")

    def _allocate_numpy(self, from_level: int) -> None:
        """Rates for the decision just stored, recomputed from ``from_level``
        on by the allocator's NumPy path (tests switch its C path off to
        compare): the same rates as the table's own allocation."""
        table, n = self._table, len(self._flows)
        ptr = self._column(table.ptr, n + 1, _I64)
        usage = Usage(ptr, self._column(table.link, int(ptr[-1]), _I64), self._column(table.weight, int(ptr[-1]), _F64))
        rate = allocate(self.capacity, usage, self._column(table.level, n, _I64), self._column(table.cap, n, _F64),
                        from_level=from_level, prev_rate=self._column(table.rate, n, _F64))
        np.frombuffer(_ffi.buffer(table.rate, 8 * n), dtype=np.float64)[:] = rate
        if _lib.lxf_table_util(table):
            raise MemoryError("no memory for the link utilization")

    @staticmethod
    def _column(pointer, n: int, dtype: np.dtype) -> np.ndarray:
        """A copy of n values of one of the table's columns."""
        return np.frombuffer(_ffi.buffer(pointer, n * dtype.itemsize), dtype=dtype).copy()

    def _schedule_completion(self, dt: float) -> None:
        """The next completion, ``dt`` from now (the table's lxf_table_next; < 0: none), replacing any earlier one."""
        self._completion_gen += 1
        if dt >= 0:
            self.queue.push(self.queue.now + dt, _COMPLETION, self._on_completion, self._completion_gen)

    # -- live-set bookkeeping -----------------------------------------------------

    def _compact(self) -> None:
        """Drop finished flows from the table and the lists (order kept)."""
        gone = self._gone
        if not gone:
            return
        _lib.lxf_table_compact(self._table)
        if len(gone) == 1:  # the usual case
            i = gone[0]
            del self._flows[i], self._callbacks[i]
        else:
            drop = set(gone)
            keep = [i for i in range(len(self._flows)) if i not in drop]
            self._flows = [self._flows[i] for i in keep]
            self._callbacks = [self._callbacks[i] for i in keep]
        gone.clear()
        self._pos = None

    def _admit_pending(self) -> None:
        """Append the flows added since the last recompute to the table and the lists."""
        pending = self._pending
        if not pending:
            return
        table, add = self._table, _lib.lxf_table_add
        for flow, callback, links, weights, entries, bneck in pending:
            if add(table, float(flow.size), float(flow.arrival), STAGE_CODES[flow.stage], bneck, entries, links,
                   weights):
                raise MemoryError("no memory for the network's flow table")
            self._flows.append(flow)
            self._callbacks.append(callback)
        pending.clear()
        self._pos = None


def _view(pointer, n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only NumPy view of n values of a C column."""
    out = np.frombuffer(_ffi.buffer(pointer, n * dtype.itemsize), dtype=dtype)
    out.flags.writeable = False
    return out


def _buffer(ctype: str, a: np.ndarray):
    """The array's buffer for C (copied first if it is not contiguous: from_buffer refuses)."""
    try:
        return _ffi.from_buffer(ctype, a)
    except ValueError:
        return _ffi.from_buffer(ctype, np.ascontiguousarray(a))


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


# The fields _decide_incremental sets on its one snapshot; any other key in its
# __dict__ is a column read (and kept) during one decision.
_INCREMENTAL_FIELDS = frozenset(("capacity", "load_window", "link_load_in_use", "now", "flows", "_net", "kept",
                                 "progressed", "remaining", "tag"))


class _Column:
    """A snapshot column read from the engine the first time, then kept in
    the instance (``functools.cached_property`` without the lock Python 3.11
    takes on every first read: a decision reads one or two columns)."""

    def __init__(self, read: Callable[["EngineSnapshot"], np.ndarray]) -> None:
        self.read = read
        self.name = read.__name__
        self.__doc__ = read.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, snap: "EngineSnapshot | None", owner: type | None = None):
        if snap is None:
            return self
        value = snap.__dict__[self.name] = self.read(snap)
        return value


class EngineSnapshot(Snapshot):
    """The engine's :class:`Snapshot`: each array column is copied from the
    engine's live arrays the first time the policy reads it.

    Built by :meth:`FluidNetwork._snapshot` for one ``decide`` call; the
    columns are only valid during that call (the engine's arrays move on
    after it), so reading one that was never read before afterwards raises
    rather than returning later numbers. ``link_load`` raises if the engine
    does not keep it (the policy said ``reads_link_load = False``). For a
    policy with ``keeps_tags``, ``remaining``, ``tag`` and
    ``link_load_in_use`` are read-only views of the engine's columns
    instead, and ``flows`` the engine's own list (no copies; valid during
    the call only), with ``kept`` and
    ``progressed`` (see :class:`~laxflow.policy.base.Snapshot`).
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

    @_Column
    def remaining(self) -> np.ndarray:  # type: ignore[override]
        return self._column("remaining", _F64)

    @_Column
    def link_load(self) -> np.ndarray:  # type: ignore[override]
        # Clipped to [0, 1] (float dust in the utilization), in one pass in C.
        net = self._engine()
        net._check_load_kept()
        out = np.empty(net.capacity.size)
        _lib.lxf_table_load_clipped(net._table, _ffi.from_buffer("double[]", out))
        return out

    @_Column
    def size(self) -> np.ndarray:
        return self._column("size", _F64)

    @_Column
    def arrival(self) -> np.ndarray:
        return self._column("arrival", _F64)

    @_Column
    def stage(self) -> np.ndarray:
        return self._column("stage", np.dtype(np.int8))

    @_Column
    def bottleneck_rate(self) -> np.ndarray:
        return self._column("bneck", _F64)

    def _column(self, name: str, dtype: np.dtype) -> np.ndarray:
        table = self._engine()._table
        return FluidNetwork._column(getattr(table, name), len(self.flows), dtype)
