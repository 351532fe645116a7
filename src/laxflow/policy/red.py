"""Robust Effective Deadline (RED): a batch's urgency, robust to outliers.

MFS §4.4.2 / Appendix B step 1. A batch runs its requests in lockstep, so one
very tight request would otherwise drag the whole (loose) batch ahead of a
globally tighter one (the *Piggyback* effect). RED splits the batch's sorted
deadlines ``d_1 <= ... <= d_n`` at the largest gap:

    k* = the first k in [1, n-1] maximising d_{k+1} - d_k
    tight = d_1..d_{k*},  loose = d_{k*+1}..d_n,  f = k*/n
    RED = f * d_1 + (1 - f) * d_{k*+1}

so a few outliers (small ``f``) barely move RED off the loose set's minimum.
A one-request batch has RED = d_1 and no loose set; its ``loose_min`` (the
deadline Algorithm 1 checks feasibility against) is d_1.

Called by the coordinator and by :mod:`laxflow.policy.inter_request` on batch
arrival and departure, and by the ``mfs`` policy when it orders batches
itself (simulation without a coordinator). Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class RedResult:
    """RED of one batch and the split behind it."""

    red: float
    k_star: int  # size of the tight set (n for a one-request batch)
    tight_min: float  # d_1
    loose_min: float  # d_{k*+1}; d_1 for a one-request batch (Algorithm 1's D^Lo)


def robust_effective_deadline(deadlines: Iterable[float]) -> RedResult:
    """RED of a batch from its requests' deadlines (any order; non-empty)."""
    d = sorted(float(x) for x in deadlines)
    n = len(d)
    if n == 0:
        raise ValueError("RED of an empty batch is undefined")
    if n == 1:
        return RedResult(red=d[0], k_star=1, tight_min=d[0], loose_min=d[0])
    k_star, best = 1, -math.inf
    for k in range(1, n):  # strict '>' keeps the first k on ties
        gap = d[k] - d[k - 1]
        if gap > best:
            k_star, best = k, gap
    f = k_star / n
    loose_min = d[k_star]
    # f*d_1 + (1-f)*d_lo, written from d_1; the clamp keeps one-ulp rounding
    # from putting RED outside [d_1, d_lo], which callers rely on.
    red = min(max(d[0] + (1.0 - f) * (loose_min - d[0]), d[0]), loose_min)
    return RedResult(red=red, k_star=k_star, tight_min=d[0], loose_min=loose_min)


def red_order(batches: Mapping[str, Sequence[float]]) -> tuple[list[str], dict[str, RedResult]]:
    """Batch ids in ascending RED (ties by batch id), and each batch's RED.

    A batch with no deadline at all (empty sequence) has RED = +inf and goes
    last: nothing says it is urgent.
    """
    results: dict[str, RedResult] = {}
    for batch, deadlines in batches.items():
        if len(deadlines) == 0:
            results[batch] = RedResult(math.inf, 0, math.inf, math.inf)
        else:
            results[batch] = robust_effective_deadline(deadlines)
    order = sorted(results, key=lambda b: (results[b].red, b))
    return order, results


def red_many(batch: np.ndarray, deadline: np.ndarray, num_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """RED and loose-set minimum of many batches at once (Algorithm 1's sort).

    ``batch[j]`` is request j's batch index, ``deadline[j]`` its deadline;
    every batch must have at least one request. Same arithmetic as
    :func:`robust_effective_deadline`, so the results are identical.
    """
    srt = np.lexsort((deadline, batch))
    b, d = batch[srt], np.asarray(deadline, float)[srt]
    start = np.searchsorted(b, np.arange(num_batches))
    size = np.diff(np.r_[start, b.size])
    gap = np.r_[d[1:] - d[:-1], -np.inf]
    gap[np.r_[start[1:] - 1, b.size - 1]] = -np.inf  # no gap across batches
    # k*: the first largest gap of each batch (offset inside the batch, 1-based)
    best = np.maximum.reduceat(gap, start)
    hits = np.flatnonzero((gap == best[b]) & (gap > -np.inf))  # ascending, so batch-major
    lead = hits[np.r_[True, b[hits][1:] != b[hits][:-1]]] if hits.size else hits
    first = np.full(num_batches, b.size, dtype=np.int64)
    first[b[lead]] = lead
    k_star = np.where(size > 1, first - start + 1, 1)
    d1 = d[start]
    loose = np.where(size > 1, d[np.minimum(start + k_star, b.size - 1)], d1)
    f = k_star / size
    red = np.minimum(np.maximum(d1 + (1.0 - f) * (loose - d1), d1), loose)
    return red, loose
