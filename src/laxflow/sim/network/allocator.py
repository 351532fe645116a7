"""Rate allocation: strict priority across levels, weighted max-min inside one.

Called by :class:`~laxflow.sim.network.engine.FluidNetwork` after every
policy decision. The flows' usage vectors come as one CSR-by-flow structure
(:class:`Usage`): flow i's entries are ``link[ptr[i]:ptr[i+1]]`` with weights
``weight[ptr[i]:ptr[i+1]]``, so at rate r flow i loads link l with
``weight * r``.

Strict priority: level 0 is allocated first on the full capacity; level k
sees only the capacity levels < k left. Inside a level, max-min fairness on
flow rates (every flow of the level is raised at the same pace; a flow stops
when one of its links saturates or it reaches its cap) — progressive filling
on the residual capacities.

Why it is fast: a plain progressive filling freezes one bottleneck link per
round. Here every link whose fair share ``residual / sum of unfrozen
weights`` is no larger than the share of every other link its unfrozen flows
cross (a *local* minimum) is frozen in the same round. That is exact: when a
flow freezes at rate r on a link whose share is r, every other link it
crosses had share >= r, and removing r*w from residual and w from weight
leaves their share >= what it was. So shares never fall, and a local minimum
now is the level at which global progressive filling would freeze that link.
A per-flow cap is a virtual link crossed by that flow alone.

The link x flow weights are kept as flat (link, weight) entries grouped by
flow rather than as a scipy.sparse matrix: each round needs a weighted sum
per link (``np.bincount``), a minimum per flow (``np.minimum.reduceat``) and
then drops the frozen flows' entries, which flat arrays do in one pass each
while a CSR/CSC matrix would have to be rebuilt every round.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

try:  # the C path (allocate_native.c), built at install; NumPy alone when it is missing
    from laxflow.sim.network._allocate_native import ffi as _ffi, lib as _lib
except ImportError:  # pragma: no cover - an install without the build
    _ffi = _lib = None

# Shares within this relative distance are treated as equal, so links that
# tie in exact arithmetic freeze in the same round despite rounding.
REL_EPS = 1e-12
# A link with less than this fraction of its capacity left is saturated.
SATURATED_REL_EPS = 1e-12


@dataclass
class Usage:
    """Usage vectors of n flows, CSR by flow (every flow has >= 1 entry, its links distinct)."""

    ptr: np.ndarray  # int64, n + 1
    link: np.ndarray  # int64, nnz: link index of each entry
    weight: np.ndarray  # float64, nnz: > 0

    @property
    def num_flows(self) -> int:
        return self.ptr.size - 1

    @cached_property
    def nnz(self) -> np.ndarray:
        """Entries per flow (computed once: a Usage is never mutated)."""
        return np.diff(self.ptr)

    def entry_flow(self) -> np.ndarray:
        """Flow index of every entry."""
        return np.repeat(np.arange(self.num_flows, dtype=np.int64), self.nnz)

    def link_load(self, rate: np.ndarray, num_links: int) -> np.ndarray:
        """Bytes/s on each link when flow i runs at ``rate[i]``."""
        return np.bincount(self.link, weights=self.weight * np.repeat(rate, self.nnz), minlength=num_links)


def water_fill(
    residual: np.ndarray,
    link: np.ndarray,
    weight: np.ndarray,
    counts: np.ndarray,
    cap: np.ndarray,
) -> np.ndarray:
    """Weighted max-min fair rates of k flows on ``residual`` link capacities.

    ``counts[i]`` consecutive entries of (``link``, ``weight``) belong to flow
    i. ``residual`` is reduced in place by what the flows use. Returns the k
    rates (bytes/s).
    """
    k = counts.size
    rates = np.zeros(k)
    if k == 0:
        return rates
    num_links = residual.size
    if k == 1:  # common with strict-priority policies: one flow per level
        # (A flow's links are distinct: the engine merges repeats on admission.)
        share = np.min(residual[link] / weight)
        rates[0] = max(0.0, min(share, cap[0]))
        residual[link] = np.maximum(residual[link] - weight * rates[0], 0.0)
        return rates
    if link.size * 4 < num_links:
        # Few entries on a big fabric: work on the level's own links so each
        # round costs O(entries), not O(links).
        mark = np.zeros(num_links, dtype=bool)
        mark[link] = True
        used_links = np.flatnonzero(mark)
        remap = np.empty(num_links, dtype=np.int64)
        remap[used_links] = np.arange(used_links.size)
        sub = residual[used_links]
        rates = water_fill(sub, remap[link], weight, counts, cap)
        residual[used_links] = sub
        return rates
    alive = np.arange(k)  # original index of every unfrozen flow
    flow_cap = cap.astype(np.float64, copy=True)
    capped = bool(np.isfinite(flow_cap).any())
    np.maximum(residual, 0.0, out=residual)
    share = np.empty(num_links)  # read only at links that carry an unfrozen flow
    while True:
        starts = np.zeros(alive.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        load = np.bincount(link, weights=weight, minlength=num_links)
        np.divide(residual, load, out=share, where=load > 0)
        entry_share = share[link]
        best = np.minimum.reduceat(entry_share, starts)
        if capped:
            np.minimum(best, flow_cap, out=best)
        # A link is a local minimum unless some flow on it can go no faster
        # than a strictly smaller share elsewhere (or its cap).
        entry_best = np.repeat(best, counts)
        blocked = np.zeros(num_links, dtype=bool)
        blocked[link[entry_best < entry_share * (1.0 - REL_EPS)]] = True
        freeze = np.logical_or.reduceat(~blocked[link], starts)
        if capped:
            freeze |= flow_cap <= best * (1.0 + REL_EPS)
        if freeze.all():
            rates[alive] = best
            residual -= np.bincount(link, weights=weight * entry_best, minlength=num_links)
            np.maximum(residual, 0.0, out=residual)
            break
        rates[alive[freeze]] = best[freeze]
        entry_freeze = np.repeat(freeze, counts)
        residual -= np.bincount(
            link[entry_freeze], weights=weight[entry_freeze] * entry_best[entry_freeze], minlength=num_links
        )
        np.maximum(residual, 0.0, out=residual)
        keep = ~entry_freeze
        link, weight = link[keep], weight[keep]
        thaw = ~freeze
        counts, alive, flow_cap = counts[thaw], alive[thaw], flow_cap[thaw]
    return rates


def allocate(
    capacity: np.ndarray,
    usage: Usage,
    level: np.ndarray,
    cap: np.ndarray,
    *,
    from_level: int | None = None,
    prev_rate: np.ndarray | None = None,
) -> np.ndarray:
    """Rates of all flows: strict priority across ``level``, max-min inside.

    With ``from_level`` and ``prev_rate``, flows at levels below
    ``from_level`` keep ``prev_rate`` (the caller guarantees those levels and
    their flows' caps are unchanged since ``prev_rate`` was computed, which
    makes their allocation identical) and only the rest is recomputed.
    With the C module built (``NATIVE``), all of it runs there, bit-identical
    to the code below: this NumPy code is the reference the C is tested
    against (the engine itself refuses to start without the C module).
    """
    n = usage.num_flows
    if n == 0:
        return np.zeros(0)
    if NATIVE:
        rates = _allocate_native(capacity, usage, level, cap, from_level, prev_rate)
        if rates is not None:
            return rates
    lowest, highest = int(level.min()), int(level.max())
    rates = np.zeros(n)
    residual = capacity.astype(np.float64, copy=True)
    counts = usage.nnz
    if from_level is not None and from_level <= lowest:
        from_level = None  # every level is recomputed
    if from_level is None and lowest == highest:
        # One level (fair sharing): no reordering needed.
        rates = water_fill(residual, usage.link, usage.weight, counts, cap)
        _snap_saturated(residual, capacity, usage.link)
        return rates
    order = np.argsort(level, kind="stable")
    sorted_level = level[order]
    if from_level is not None and prev_rate is not None:
        kept = np.flatnonzero(level < from_level)
        rates[kept] = prev_rate[kept]
        residual -= usage.link_load(np.where(level < from_level, prev_rate, 0.0), capacity.size)
        _snap_saturated(residual, capacity)
        first = int(np.searchsorted(sorted_level, from_level, side="left"))
    else:
        first = 0
    if first == n:
        return rates
    order = order[first:]
    sorted_level = sorted_level[first:]
    # Gather the entries of the flows in level order (each flow's entries stay
    # contiguous), without a sort over entries.
    ocounts = counts[order]
    ostarts = usage.ptr[order]
    offsets = np.zeros(order.size, dtype=np.int64)
    np.cumsum(ocounts[:-1], out=offsets[1:])
    entry_index = np.repeat(ostarts - offsets, ocounts) + np.arange(int(ocounts.sum()))
    elink = usage.link[entry_index]
    eweight = usage.weight[entry_index]
    ocap = cap[order]
    bounds = np.flatnonzero(np.diff(sorted_level)) + 1
    flow_edges = np.concatenate([[0], bounds, [order.size]])
    entry_edges = np.concatenate([[0], np.cumsum(ocounts)])[flow_edges]
    for a, b, ea, eb in zip(flow_edges[:-1], flow_edges[1:], entry_edges[:-1], entry_edges[1:]):
        level_links = elink[ea:eb]
        rates[order[a:b]] = water_fill(residual, level_links, eweight[ea:eb], ocounts[a:b], ocap[a:b])
        _snap_saturated(residual, capacity, level_links)
    return rates


# Whether allocate runs in C (tests switch it off to compare the paths).
NATIVE = _lib is not None
_REL_BELOW, _REL_ABOVE = 1.0 - REL_EPS, 1.0 + REL_EPS  # as water_fill computes them


_F64, _I64 = np.dtype(np.float64), np.dtype(np.int64)
_DOUBLES = _INT64S = None
if _ffi is not None:
    _DOUBLES, _INT64S = _ffi.typeof("double[]"), _ffi.typeof("int64_t[]")


def _arg(ffi_type: object, a: np.ndarray, dtype: np.dtype) -> object:
    """The array's buffer for C, converted first if its dtype is not ``dtype``
    (from_buffer takes raw bytes) or it is not contiguous (from_buffer refuses)."""
    if a.dtype is not dtype and a.dtype != dtype:
        a = np.ascontiguousarray(a, dtype=dtype)
    try:
        return _ffi.from_buffer(ffi_type, a)
    except ValueError:  # not C-contiguous
        return _ffi.from_buffer(ffi_type, np.ascontiguousarray(a))


def _allocate_native(
    capacity: np.ndarray, usage: Usage, level: np.ndarray, cap: np.ndarray, from_level: int | None,
    prev_rate: np.ndarray | None,
) -> np.ndarray | None:
    """``allocate`` in C (None if C could not get memory or a link is out of
    range: the caller goes on in NumPy, which raises for the latter)."""
    n = usage.num_flows
    rates = np.empty(n)
    prev = _ffi.NULL if prev_rate is None else _arg(_DOUBLES, prev_rate, _F64)
    rc = _lib.lxf_allocate(
        n, _arg(_INT64S, usage.ptr, _I64), _arg(_INT64S, usage.link, _I64),
        _arg(_DOUBLES, usage.weight, _F64), _arg(_INT64S, level, _I64),
        _arg(_DOUBLES, cap, _F64), _arg(_DOUBLES, capacity, _F64), capacity.size,
        from_level is not None, 0 if from_level is None else int(from_level), prev,
        _REL_BELOW, _REL_ABOVE, SATURATED_REL_EPS, _ffi.from_buffer(_DOUBLES, rates),
    )
    return rates if rc == 0 else None


def _snap_saturated(residual: np.ndarray, capacity: np.ndarray, links: np.ndarray | None = None) -> None:
    """Zero what rounding leaves on a saturated link (of ``links``, default
    all), so lower levels get 0 there rather than a rate of 1e-16 that never
    finishes."""
    if links is None:
        residual[residual <= capacity * SATURATED_REL_EPS] = 0.0
        return
    left = residual[links]
    residual[links[left <= capacity[links] * SATURATED_REL_EPS]] = 0.0

