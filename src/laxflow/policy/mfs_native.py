"""The native path of :meth:`MfsPolicy.decide`: the decision step in C.

Python keeps what needs Python objects: admitting new flows (their static
facts, the batch and request tables), the period of the explicit-load
measurement, RED order and pruning (``MfsPolicy._reorder``), and the
per-flow notes in ``Flow.state``. Everything else the scalar path
(:mod:`laxflow.policy.mfs_scalar`) does per live flow (the explicit-load
average, entry levels, promotions, arbitration keys, dense levels, the
period timer) is one call into ``mfs_native.c``, with the same float
operations in the same order: decisions and policy state are bit-identical
to the Python paths; ``tests/policy`` replays recorded runs through each
path and compares.

Called only by ``MfsPolicy.decide`` on the engine's (or daemon's) thread.
``NATIVE`` is False when the module was not built (no C compiler at
install): the policy then runs its Python paths.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from laxflow.policy.base import Decision, Snapshot
from laxflow.policy.flow import STAGE_CODES, Stage
from laxflow.policy.mfs_scalar import _admit_one

if TYPE_CHECKING:
    from laxflow.policy.mfs import MfsPolicy

try:
    from laxflow.policy._mfs_native import ffi as _ffi, lib as _lib
except ImportError:  # not built: the Python paths
    _ffi = _lib = None

NATIVE = _lib is not None
if NATIVE and (_lib.LXF_MFS_STAGE_COLLECTIVE, _lib.LXF_MFS_STAGE_P2D) != (
    STAGE_CODES[Stage.COLLECTIVE], STAGE_CODES[Stage.P2D]
):
    raise ImportError("laxflow.policy._mfs_native was built with other stage codes than laxflow.policy.flow")

_NAN = float("nan")
_I64, _F64, _U8 = np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.uint8)
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
    they stay alive), and the out-buffers. Re-binds an array whenever the
    policy replaced it (a table grew, the link count changed)."""

    def __init__(self, p: MfsPolicy) -> None:
        self.struct = _ffi.new("struct lxf_mfs *")
        self.held: dict[str, object] = {}  # field -> the array (or its cdata) bound there
        s = self.struct
        s.levels = p.config.levels
        s.period = p.config.period
        s.load_window = p.config.load_window
        self._thresholds = _ffi.new("double[]", p._q_ascending or [0.0])
        s.thresholds = self._thresholds
        s.num_thresholds = len(p._q_ascending)
        self._codes = np.ascontiguousarray(p._dscp_codes, np.uint8)
        s.dscp_codes = _ffi.from_buffer("uint8_t[]", self._codes)
        self._room = 0
        self._ints = self._noted = None
        self._counts = _ffi.new("int64_t[2]")
        self._timer = _ffi.new("double *")

    def __del__(self) -> None:
        if _lib is not None and self.struct is not None:
            _lib.lxf_mfs_free(self.struct)

    def _bind(self, field: str, array: np.ndarray, ctype: str) -> None:
        if self.held.get(field) is not array:
            setattr(self.struct, field + ("_" if field == "explicit" else ""), _ffi.from_buffer(ctype, array))
            self.held[field] = array

    def bind(self, p: MfsPolicy, capacity: np.ndarray) -> None:
        """Point the struct at the policy's current arrays (cheap when none was replaced)."""
        t = p.rmlq
        if self.held.get("urgency") is not t.urgency:  # Rmlq replaces all of them together
            for name, ctype in _SLOT_FIELDS:
                self._bind(name, getattr(t, name), ctype)
        self._bind("rank", p._rank, "int64_t[]")
        self._bind("pruned", p._pruned, "uint8_t[]")
        self._bind("explicit_load", p._explicit_load, "double[]")
        self._bind("finished_bytes", p._finished_bytes, "double[]")
        if self.held.get("capacity") is not capacity:
            if capacity.dtype != _F64 or not capacity.flags.c_contiguous:
                capacity = np.ascontiguousarray(capacity, np.float64)
            self._bind("capacity", capacity, "double[]")
            self.held["capacity"] = capacity
            self.struct.num_links = len(capacity)

    def buffers(self, n: int):
        """(noted pairs, infeasible positions) out-buffers with room for ``n`` flows."""
        if n > self._room:
            self._room = max(n, 2 * self._room)
            self._noted = _ffi.new("int64_t[]", 2 * self._room)
            self._ints = _ffi.new("int64_t[]", self._room)
        return self._noted, self._ints


def decide_native(p: MfsPolicy, snap: Snapshot) -> Decision:
    """``MfsPolicy.decide`` for a snapshot with at least one flow, in C."""
    t = p.rmlq
    flows = snap.flows
    n = len(flows)
    slot = t.slot
    idx = list(map(slot.get, flows))
    new = [i for i, s in enumerate(idx) if s is None] if None in idx else []
    if new:
        for i in new:  # slots in snapshot order first, then the facts (as the other paths)
            idx[i] = t.allocate(flows[i])
        for i in new:
            _admit_one(p, flows[i], idx[i], snap.capacity)
    interval = p._measure_interval(snap)
    if p._order_stale:  # (reads no level: the same order as the scalar path's, after its promotions)
        p._reorder(snap)
    core = p._native
    if core is None:
        core = p._native = NativeCore(p)
    capacity = snap.capacity
    core.bind(p, capacity)
    remaining = snap.remaining
    if remaining.dtype != _F64 or not remaining.flags.c_contiguous:
        remaining = np.ascontiguousarray(remaining, np.float64)
    current = list(map(_current, flows))
    if None in current:  # no layer known: NaN
        current = [_NAN if c is None else c for c in current]
    done = list(map(_compute_done, flows))
    finished = p._finished_links
    level = np.empty(n, np.int64)
    queue = np.empty(n, np.int64)
    dscp = np.empty(n, np.uint8)
    noted, bad = core.buffers(n)
    counts, timer = core._counts, core._timer
    args = [
        core.struct, n, idx, new, len(new), current, done, _ffi.from_buffer("double[]", remaining), _ffi.NULL,
        snap.now, -1.0 if interval is None else interval[1] - interval[0], list(finished) if finished else _ffi.NULL,
        len(finished), _ffi.from_buffer("int64_t[]", level), _ffi.from_buffer("int64_t[]", queue),
        _ffi.from_buffer("uint8_t[]", dscp), timer, noted, bad, counts,
    ]
    rc = _lib.lxf_mfs_decide(*args)
    if rc == _lib.LXF_MFS_NEED_LOAD:
        link_load = snap.link_load
        if link_load.dtype != _F64 or not link_load.flags.c_contiguous:
            link_load = np.ascontiguousarray(link_load, np.float64)
        args[8] = _ffi.from_buffer("double[]", link_load)
        rc = _lib.lxf_mfs_decide(*args)
    if rc:
        raise MemoryError("no memory for the mfs decision")
    if finished and interval is not None:
        finished.clear()
    if counts[0]:
        for j in range(counts[0]):
            flows[noted[2 * j]].state["rmlq_level"] = noted[2 * j + 1]
    if counts[1]:
        for i in _ffi.unpack(bad, counts[1]):
            p.infeasible.add(flows[i].id)
            flows[i].state["infeasible"] = True
    p._view.active = False  # a from-scratch decision: the incremental path starts over
    t_next = timer[0]
    return Decision(level=level, queue=queue, dscp=dscp, timers=() if t_next != t_next else (t_next,))
