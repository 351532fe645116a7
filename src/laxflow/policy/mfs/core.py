"""The native path of :meth:`MfsPolicy.decide`: the decision step in C.

Python keeps what needs Python objects: admitting new flows (their static
facts, the batch and request tables), the period of the explicit-load
measurement, RED order and pruning (``MfsPolicy._reorder``), and the
per-flow notes in ``Flow.state``. Of these, admission, completion
(``MfsPolicy.on_complete``) and the per-decision glue of an incremental
decision (:func:`decide_tagged`) run
in C through the CPython API when ``laxflow.policy.mfs._glue`` is built
(``glue.c``: the same dict, list and set operations on the same
objects, this module's Python for the rare steps). Everything else per
live flow (the explicit-load average, entry levels, promotions,
arbitration keys, dense levels, the period timer) is one call into
``core.c``, with the float operations of the reference (the
vectorized ``MfsPolicy.decide``) in its order: decisions and policy state
are bit-identical to it; ``tests/policy`` replays recorded runs through
both and compares. The admission helpers at the end (bottleneck, static
facts) serve both.

Called by ``MfsPolicy.decide`` on the caller's one thread: a plain
snapshot (the node daemon, tests: :func:`decide_native`) or an incremental
one (``Snapshot.tag``, the network engine: :func:`decide_tagged`). ``NATIVE`` is False when the module was not built (no
C compiler at install): the policy then runs its reference, in NumPy.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import TYPE_CHECKING, Callable

import numpy as np

from laxflow.policy.base import Decision, Snapshot
from laxflow.policy.flow import STAGE_CODES, Flow, Stage

if TYPE_CHECKING:
    from laxflow.policy.mfs.policy import MfsPolicy

try:
    from laxflow.policy.mfs._core import ffi as _ffi, lib as _lib
except ImportError:  # not built: the Python paths
    _ffi = _lib = None

try:  # the per-flow glue (glue.c), a CPython extension built with the cffi module
    from laxflow.policy.mfs._glue import Glue
except ImportError:  # not built: admission and completion in Python
    Glue = None

NATIVE = _lib is not None  # (its stage codes are laxflow_shm.h's LXF_STAGE_*, as laxflow.stage's)

_NAN = float("nan")
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
# Positions in lxf_mfs_decide's argument list that _step reads back.
_ARG_LINK_LOAD, _ARG_N_FINISHED = 10, 15
_current = attrgetter("current_layer")
_compute_done = attrgetter("compute_done")
# The Rmlq slot arrays the C struct points into, with their C types.
_SLOT_FIELDS = (
    ("urgency", "int64_t[]"), ("explicit", "uint8_t[]"), ("stage", "int8_t[]"), ("target", "double[]"),
    ("due", "double[]"), ("bneck_link", "int64_t[]"), ("bneck_rate", "double[]"), ("bneck_weight", "double[]"),
    ("last_rem", "double[]"), ("batch", "int64_t[]"), ("request", "int64_t[]"), ("layer_at", "double[]"),
    ("tick_at", "int64_t[]"),
)  # fmt: skip


class NativeCore:
    """One policy's C state: the struct, the arrays it points into (held, so
    they stay alive), and the out-buffers. Re-binds the arrays whenever the
    policy replaced one (the RMLQ grew, ``MfsPolicy._arrays_gen`` moved, the
    capacity array is another)."""

    def __init__(self, p: MfsPolicy) -> None:
        self.struct = _ffi.new("struct lxf_mfs *")
        s = self.struct
        s.levels = p.config.levels
        s.period = p.config.period
        s.load_window = p.config.load_window
        self._thresholds = _ffi.new("double[]", p._q_ascending or [0.0])
        s.thresholds = self._thresholds
        s.num_thresholds = len(p._q_ascending)
        self._codes = np.ascontiguousarray(p._dscp_codes, np.uint8)
        s.dscp_codes = _ffi.from_buffer("uint8_t[]", self._codes)
        # What the struct is bound to: the RMLQ's urgency array (the slot arrays
        # are replaced together), the capacity array, the policy's _arrays_gen
        # (-1: bind again); the incremental decision's out-arrays (buffers()),
        # and the Decision over their first n (views, by n).
        self.urgency = self.capacity = self.engine = self.out = None
        self.views: dict[int, Decision] = {}
        self.gen = -1
        self._room = 0
        self.noted = self.bad = None
        self.counts = _ffi.new("int64_t[2]")
        self.timer = _ffi.new("double *")
        s.o_counts = self.counts
        s.o_timer = self.timer
        s.note_levels = p.flow_notes
        self.dt = -1.0  # the decision's explicit-load interval (s; < 0: none), set by _core
        # Admission, completion and the incremental decision's glue in C (glue.c)
        # when built: the policy's on_complete and decide_tagged hand over to it
        # (MfsPolicy._glue), and it is told whenever the struct is bound.
        self.glue = None if Glue is None else Glue(
            p, self, _address(s), _address(_ffi.addressof(_lib, "lxf_mfs_admit")),
            _address(_ffi.addressof(_lib, "lxf_mfs_progress")), _address(_ffi.addressof(_lib, "lxf_mfs_decide_engine")),
            STAGE_CODES, Stage.P2D, Flow, _NAN,
            bottleneck, admission_facts, _admit_new, _bound, _after_step,
        )  # fmt: skip
        p._glue = self.glue

    def _tell_glue(self) -> None:
        """What the struct is bound to now, for the glue's checks (Glue.bound)."""
        if self.glue is not None:
            self.glue.bound(self.gen, self.urgency, self.capacity, self._room)

    def unbind(self) -> None:
        """Bind the policy's arrays again at the next decision (a Python path changed them in place)."""
        self.gen = -1
        self._tell_glue()

    @staticmethod
    def finished(p: MfsPolicy) -> tuple:
        """The step's (finished, n_finished): the links where the policy's finished bytes are not 0."""
        links = p._finished_links
        return (list(links), len(links)) if links else (_ffi.NULL, 0)

    def __del__(self) -> None:
        if _lib is not None and getattr(self, "struct", None) is not None:
            _lib.lxf_mfs_free(self.struct)

    def bind(self, p: MfsPolicy, capacity: np.ndarray) -> None:
        """Point the struct at the policy's current arrays (called when one of them was replaced)."""
        if p._explicit_load.size != len(capacity):  # (the per-link averages first: they are bound too)
            p._fit_links(len(capacity))
        t, s = p.rmlq, self.struct
        for name, ctype in _SLOT_FIELDS:
            setattr(s, "explicit_" if name == "explicit" else name, _ffi.from_buffer(ctype, getattr(t, name)))
        self._rank, self._pruned, self._load, self._finished = p._rank, p._pruned, p._explicit_load, p._finished_bytes
        s.rank = _ffi.from_buffer("int64_t[]", p._rank)
        s.pruned = _ffi.from_buffer("uint8_t[]", p._pruned)
        s.explicit_load = _ffi.from_buffer("double[]", p._explicit_load)
        s.finished_bytes = _ffi.from_buffer("double[]", p._finished_bytes)
        held = capacity
        if capacity.dtype != _F64 or not capacity.flags.c_contiguous:
            held = np.ascontiguousarray(capacity, np.float64)
        self._capacity = held
        s.capacity = _ffi.from_buffer("double[]", held)
        s.num_links = len(held)
        s.slots = len(t.urgency)
        s.nonzero_valid = 0
        self.urgency, self.capacity, self.gen = t.urgency, capacity, p._arrays_gen
        self._tell_glue()

    def buffers(self, n: int) -> None:
        """Room for ``n`` flows in the out-buffers (noted pairs, infeasible
        positions; an incremental decision's level, queue, DSCP and tags)."""
        room = self._room = max(n, 2 * self._room)
        s = self.struct
        self.noted = _ffi.new("int64_t[]", 2 * room)
        self.bad = _ffi.new("int64_t[]", room)
        s.o_noted = self.noted
        s.o_infeasible = self.bad
        self.out = (np.empty(room, np.int64), np.empty(room, np.int64), np.empty(room, np.uint8),
                    np.empty(room, np.int64))
        level, queue, dscp, tag = self.out
        s.e_level, s.e_queue = _ffi.from_buffer("int64_t[]", level), _ffi.from_buffer("int64_t[]", queue)
        s.e_dscp, s.e_tag = _ffi.from_buffer("uint8_t[]", dscp), _ffi.from_buffer("int64_t[]", tag)
        # (the glue's argument: its slot [5] is where admission writes the new flows' tags)
        self.engine = (_ffi.NULL, _ffi.NULL, s.e_level, s.e_queue, s.e_dscp, s.e_tag)
        self.views = {}
        self._tell_glue()


def decide_native(p: MfsPolicy, snap: Snapshot) -> Decision:
    """``MfsPolicy.decide`` for a snapshot with at least one flow, in C."""
    flows = snap.flows
    n = len(flows)
    idx, new = admit(p, flows, snap.capacity)
    remaining = snap.remaining
    if remaining.dtype != _F64 or not remaining.flags.c_contiguous:
        remaining = np.ascontiguousarray(remaining, np.float64)
    level = np.empty(n, np.int64)
    queue = np.empty(n, np.int64)
    dscp = np.empty(n, np.uint8)
    p._progress_kept = False  # (the incremental path reads every flow's progress again)
    core = _core(p, snap.capacity, n, snap.now, lambda: snap)
    core.struct.note_levels = p.flow_notes
    current, done = _progress(flows)
    args = [
        core.struct, n, idx, new, len(new), current, done, _ffi.NULL, _ffi.NULL,
        _ffi.from_buffer("double[]", remaining), _ffi.NULL, 0, snap.now, core.dt, *core.finished(p),
        _ffi.from_buffer("int64_t[]", level), _ffi.from_buffer("int64_t[]", queue),
        _ffi.from_buffer("uint8_t[]", dscp), core.timer, core.noted, core.bad, core.counts,
    ]  # fmt: skip
    timer = _step(p, core, flows, args, lambda: snap)
    return Decision(level=level, queue=queue, dscp=dscp, timers=() if timer is None else (timer,))


def decide_tagged(p: MfsPolicy, snap: Snapshot) -> Decision:
    """``MfsPolicy.decide`` for an incremental snapshot (``Snapshot.tag``: the
    network engine) with at least one flow, in C: the first ``snap.kept``
    flows' RMLQ slots are their tags, the new flows' slots become theirs in
    the decision's ``tag``. Request progress is read from the flows only if
    the owner ``progressed`` them (True, every flow; a list, those flows) or
    they are new, while the C step's per-slot progress is this path's own
    (``MfsPolicy._progress_kept``). ``remaining`` and ``link_load_in_use``
    are read in place (unclipped: clipped in C). The decision and its arrays
    are the policy's, valid until its next decision."""
    flows, capacity = snap.flows, snap.capacity
    n = len(flows)
    core = p._native
    if core is None or n > core._room:
        if core is None:
            core = _bound(p, capacity)
        core.buffers(max(n, 1))
    remaining, tag, load = snap.remaining, snap.tag, snap.link_load_in_use
    if load is None:  # (the owner has no view in place: the clipped average, clipped again in C)
        load = snap.link_load
    if remaining.dtype is not _F64 or tag.dtype is not _I64 or load.dtype is not _F64:  # (C-contiguous: checked in C)
        remaining, load = np.ascontiguousarray(remaining, np.float64), np.ascontiguousarray(load, np.float64)
        tag = np.ascontiguousarray(tag, np.int64)
    progressed = snap.progressed
    if not p._progress_kept:
        progressed = True
        core.struct.note_levels = p.flow_notes
        p._progress_kept = True
    glue = core.glue
    if glue is not None:
        timer = glue.decide(flows, snap.now, snap.kept, progressed, capacity, (remaining, tag, load), snap)
    else:
        timer = _decide_incremental(p, core, flows, snap.now, snap.kept, progressed, capacity,
                                    (remaining, tag, load), snap)
    decision = core.views.get(n)  # (one Decision per n over the out-arrays: handed out again, its timers set)
    if decision is None:
        if len(core.views) >= 4096:
            core.views.clear()
        out = core.out
        decision = core.views[n] = Decision(level=out[0][:n], queue=out[1][:n], dscp=out[2][:n], tag=out[3][:n])
    decision.timers = () if timer is None else (timer,)
    return decision


def _decide_incremental(p: MfsPolicy, core: NativeCore, flows: list, now: float, kept: int,
                        progressed: bool | list, capacity: np.ndarray, columns: tuple,
                        snap: Snapshot) -> float | None:
    """:func:`decide_tagged`'s steps when the glue is not built (``Glue.decide``
    runs the same steps in C, this Python for the rare ones): the snapshot's
    ``columns`` (remaining, tag, link_load) bound, the kept flows' tags
    copied, admission, progress, RED order, the explicit-load interval, the
    C step. The timer, None: none."""
    n = len(flows)
    remaining, tag, load = (np.ascontiguousarray(c) for c in columns)
    held = _ffi.from_buffer("double[]", remaining), _ffi.from_buffer("double[]", load)
    s = core.struct
    s.e_remaining, s.e_link_load = held
    core.out[3][:kept] = tag[:kept]
    null = _ffi.NULL
    every = progressed is True
    if kept < n:  # (their progress goes in with their facts)
        _admit_new(p, flows, kept, capacity)
    current, done = _progress(flows) if every else (null, null)
    if p._order_stale:  # (reads no level: the scalar path's order, after its promotions; pruning reads snapshot())
        p._reorder(snap)
    core = _bound(p, capacity)  # (after admission and reorder: either may have replaced an array)
    if n > core._room:
        core.buffers(n)
    if progressed and not every:  # the flows the owner named: their progress, by slot
        _progress_of(p, progressed)
    last, p._last_t = p._last_t, now  # (MfsPolicy._measure_interval_at; the links were fitted at binding)
    dt = -1.0 if last is None or now <= last else now - last
    finished = p._finished_links
    if finished:
        rc = _lib.lxf_mfs_decide_engine(core.struct, n, n - kept, current, done, now, dt, list(finished),
                                        len(finished))
        if not rc and dt >= 0:  # (as _after_step: the finished bytes are in the average now)
            finished.clear()
    else:
        rc = _lib.lxf_mfs_decide_engine(core.struct, n, n - kept, current, done, now, dt, null, 0)
    if rc or core.counts[0] or core.counts[1]:
        return _after_step(p, core, flows, rc, 0)
    t_next = core.timer[0]
    return None if t_next != t_next else t_next


def _admit_new(p: MfsPolicy, flows: list, kept: int, capacity: np.ndarray) -> None:
    """The snapshot's new flows (positions ``kept`` on) into the RMLQ: their
    slots in the decision's tag array (``NativeCore.engine[5]``; in snapshot
    order first, then the facts, as the other paths), their static facts and request progress into the slot arrays
    (``lxf_mfs_admit``), the facts into ``rmlq.facts``, their batch and
    request entered. In C (``Glue.admit``) when built: the same steps."""
    t = p.rmlq
    core = p._native
    glue = core.glue
    if glue is not None:
        if core.urgency is not t.urgency:  # (the struct as the slot arrays are now: the facts go there)
            _bound(p, capacity)
        if glue.admit(flows, kept, capacity, False):  # (False: fewer free slots than new flows; nothing done)
            return
    new = flows[kept:]
    slots = list(map(t.allocate, new))
    core.engine[5][kept : kept + len(slots)] = slots
    struct = _bound(p, capacity).struct  # (the facts go into the slot arrays as they are now)
    if glue is not None:
        glue.admit(flows, kept, capacity, True)
        return
    facts, admit = t.facts, _lib.lxf_mfs_admit
    for f, s, fact in zip(new, slots, admission_facts(p, new, capacity)):
        facts[s] = fact
        current = f.current_layer
        rc = admit(struct, s, f.size, _NAN if current is None else current, f.compute_done, *fact)
        if rc:
            if rc == _lib.LXF_MFS_NO_MEMORY:
                raise MemoryError("no memory for the mfs request progress")
            raise RuntimeError("mfs: a new flow's RMLQ slot is out of range for the C step (policy state out of step)")


def _address(cdata) -> int:
    """A C pointer's address, for the glue (which is not a cffi module)."""
    return int(_ffi.cast("uintptr_t", cdata))


def _progress_of(p: MfsPolicy, named: list) -> None:
    """The progress of the flows the owner named (``reschedule(flows)``) into
    the C step's per-slot progress; flows no longer live are skipped (new
    ones were read at admission)."""
    slots = list(map(p.rmlq.slot.get, named))
    if None in slots:  # (some not admitted yet, or done)
        live = [(s, f) for s, f in zip(slots, named) if s is not None]
        if not live:
            return
        slots, named = zip(*live)
    current, done = _progress(named)
    rc = _lib.lxf_mfs_progress(p._native.struct, len(slots), slots, current, done)
    if rc == _lib.LXF_MFS_BAD_INDEX:
        raise RuntimeError("mfs: a named flow's RMLQ slot is out of range for the C step (policy state out of step)")
    if rc:
        raise MemoryError("no memory for the mfs request progress")


def _progress(flows: list) -> tuple[list, bytes]:
    """The flows' current layers (NaN: none) and compute-ended flags, for C."""
    current = list(map(_current, flows))
    if None in current:  # no layer known: NaN
        current = [_NAN if c is None else c for c in current]
    return current, bytes(map(_compute_done, flows))


def _bound(p: MfsPolicy, capacity: np.ndarray) -> NativeCore:
    """The policy's C state, made on first use, bound to its current arrays
    (bound again only when one of them was replaced)."""
    core = p._native
    if core is None:
        core = p._native = NativeCore(p)
    if core.gen != p._arrays_gen or core.urgency is not p.rmlq.urgency or core.capacity is not capacity:
        core.bind(p, capacity)
    return core


def _core(p: MfsPolicy, capacity: np.ndarray, n: int, now: float, snapshot: Callable[[], Snapshot]) -> NativeCore:
    """The C state for a decision over ``n`` flows at ``now``: the explicit-load
    interval started (``core.dt``, < 0: none), RED order brought up to date
    (which reads no level: the scalar path's order, after its promotions;
    pruning reads ``snapshot()``), the arrays bound as they are after both,
    room for n."""
    interval = p._measure_interval_at(now, len(capacity))
    if p._order_stale:
        p._reorder(snapshot)
    core = _bound(p, capacity)
    if n > core._room:
        core.buffers(n)
    core.dt = -1.0 if interval is None else interval[1] - interval[0]
    return core


def _step(p: MfsPolicy, core: NativeCore, flows: list, args: list, snapshot: Callable[[], Snapshot]) -> float | None:
    """The C step with ``args`` (``link_load`` NULL: a snapshot's, read from
    ``snapshot()`` as it is, only when an explicit flow's MLU is due), then
    its notes on the flows; the timer, None: none."""
    rc = _lib.lxf_mfs_decide(*args)
    if rc == _lib.LXF_MFS_NEED_LOAD:
        load = snapshot().link_load
        if load.dtype != _F64 or not load.flags.c_contiguous:
            load = np.ascontiguousarray(load, np.float64)
        args[_ARG_LINK_LOAD] = _ffi.from_buffer("double[]", load)
        rc = _lib.lxf_mfs_decide(*args)
    return _after_step(p, core, flows, rc, args[_ARG_N_FINISHED])


def _after_step(p: MfsPolicy, core: NativeCore, flows: list, rc: int, n_finished: int) -> float | None:
    """After the C step returned ``rc`` (``n_finished``: the finished links it was
    handed): its errors raised, its notes put on the flows; the timer, None: none."""
    if rc == _lib.LXF_MFS_BAD_INDEX:
        raise RuntimeError("mfs: a flow's RMLQ slot or link is out of range for the C step (policy state out of step)")
    if rc == _lib.LXF_MFS_NEED_LOAD:
        raise RuntimeError("mfs: the C step needs a link load and was given none")
    if rc:
        raise MemoryError("no memory for the mfs decision")
    if n_finished and core.dt >= 0:
        p._finished_links.clear()
    counts = core.counts
    if counts[0]:
        noted = _ffi.unpack(core.noted, 2 * counts[0])  # (position, level) pairs
        for i, q in zip(noted[::2], noted[1::2]):
            flows[i].state["rmlq_level"] = q
    if counts[1]:
        for i in _ffi.unpack(core.bad, counts[1]):
            p.note_infeasible(flows[i])
    t_next = core.timer[0]
    return None if t_next != t_next else t_next


# ------------------------------------------------------------ admission (every path)


def bottleneck(p: MfsPolicy, f: Flow, capacity: np.ndarray) -> tuple[int, float, float]:
    """The flow's bottleneck alone: (first link attaining the min of capacity /
    weight, that min, the flow's weight there).

    Read-only usage arrays (the serving simulator's transfer shapes, shared
    by every flow of a shape) are looked up in ``p._bneck_cache`` by identity;
    the entry keeps the arrays alive, so an id is never reused for others."""
    links_a, weights_a = f.links, f.weights
    frozen = not (links_a.flags.writeable or weights_a.flags.writeable)
    if frozen:
        hit = p._bneck_cache.get((id(links_a), id(weights_a)))
        if hit is not None and hit[2] is capacity:
            return hit[3]
    links = links_a.tolist()
    weights = weights_a.tolist()
    cap = capacity[links_a].tolist()
    per_link = [_ratio(c, w) for c, w in zip(cap, weights)]
    best = min(per_link)
    first = per_link.index(best)  # first link attaining the min
    out = (links[first], best, weights[first])
    if frozen:
        if len(p._bneck_cache) >= 4096:  # bounded: many distinct frozen arrays is not the serving case
            p._bneck_cache.clear()
        p._bneck_cache[(id(links_a), id(weights_a))] = (links_a, weights_a, capacity, out)
    return out


def admit(p: MfsPolicy, flows: list[Flow], capacity: np.ndarray) -> tuple[list[int], list[int]]:
    """The RMLQ slots of ``flows`` in order, new flows admitted (slots in
    snapshot order first, then their facts, as every path does), and the
    positions of the new ones (the scalar and native paths)."""
    t = p.rmlq
    idx = list(map(t.slot.get, flows))
    new = [i for i, s in enumerate(idx) if s is None] if None in idx else []
    if new:
        for i in new:
            idx[i] = t.allocate(flows[i])
        for i in new:
            _admit_one(p, flows[i], idx[i], capacity)
    return idx, new


def admission_facts(p: MfsPolicy, flows: list[Flow], capacity: np.ndarray) -> list[tuple]:
    """New flows' ``Rmlq.facts``, in order: (explicit, stage, bottleneck link,
    rate and weight there, batch index, request index, target layer, due
    time; NaN: none), the flows entered in the policy's batch and request
    tables. Shared by the scalar and native paths' admission (hundreds of
    thousands of flows per run: a plain Flow's fields are read directly, as
    its ``due`` and ``has_explicit_deadline`` compute them)."""
    out = []
    p2d, codes = Stage.P2D, STAGE_CODES
    for f, (b, r) in zip(flows, p._enter_many(flows)):
        link, rate, weight = bottleneck(p, f, capacity)
        layer = f.layer
        target = _NAN if layer is None else float(layer)
        if type(f) is Flow:
            d, kind = f.deadline, f.stage
            due = _NAN if d is None else float(d - f.downstream)
            out.append((kind is p2d and d is not None, codes[kind], link, rate, weight, b, r, target, due))
        else:
            due = _NAN if (d := f.due) is None else float(d)  # (a subclass may define its own)
            out.append((f.has_explicit_deadline, codes[f.stage], link, rate, weight, b, r, target, due))
    return out


def _admit_one(p: MfsPolicy, f: Flow, s: int, capacity: np.ndarray) -> None:
    """Static facts of a new flow (``MfsPolicy._admit`` for one flow), in the arrays and ``rmlq.facts``."""
    t = p.rmlq
    facts = t.facts[s] = admission_facts(p, [f], capacity)[0]
    explicit, stage, link, rate, weight, b, r, target, due = facts
    t.bneck_link[s] = link
    t.bneck_rate[s] = rate
    t.bneck_weight[s] = weight
    t.last_rem[s] = f.size
    t.explicit[s] = explicit
    t.stage[s] = stage
    t.target[s] = target
    t.due[s] = due
    t.batch[s] = b
    t.request[s] = r


def _ratio(capacity: float, weight: float) -> float:
    """capacity / weight as NumPy divides (a zero weight gives inf, not an error)."""
    if weight == 0.0:
        return math.copysign(math.inf, capacity) if capacity else _NAN
    return capacity / weight
