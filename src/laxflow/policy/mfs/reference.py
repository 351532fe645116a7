"""The reference decision step of MFS: the paper's per-flow rules, vectorized.

Pure functions over arrays (the RMLQ slot table :class:`~laxflow.policy.rmlq.Rmlq`,
a snapshot's columns, the policy's per-batch RED rank and per-request pruned
flags); nothing here keeps state. :class:`~laxflow.policy.mfs.MfsPolicy`
runs them when the C core (``core.c``) is not built, and the tests hold the
core to them decision by decision (``tests/policy/test_mfs_native_reference.py``,
``test_mfs_regression.py``): ``core.c`` does these float operations in
this order, flow by flow.

* :func:`candidates` -- the level a flow would have now: MLU level for an
  explicit-deadline flow (:mod:`~laxflow.policy.mlu`, against the link load
  less MFS's own explicit traffic), RLI otherwise (:mod:`~laxflow.policy.rli`);
* :func:`explicit_load` -- the moving average of explicit traffic per link
  (the rho of ``mlu.py``);
* :func:`arbitrate` -- queues (pruned requests' own flows in the scavenger),
  the engine's dense levels (:mod:`~laxflow.policy.arbitration`), DSCP and
  the period timer.
"""

from __future__ import annotations

import math

import numpy as np

from laxflow.policy.arbitration import engine_levels, queue_of
from laxflow.policy.flow import STAGE_CODES, Stage
from laxflow.policy.mlu import level_of, mlu
from laxflow.policy.rli import rli
from laxflow.policy.rmlq import Rmlq

_COLLECTIVE = STAGE_CODES[Stage.COLLECTIVE]


def candidates(t: Rmlq, idx: np.ndarray, current: np.ndarray, remaining: np.ndarray, link_load: np.ndarray,
               explicit_load: np.ndarray, now: float, thresholds: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Urgency each flow (RMLQ slots ``idx``, with its current layer and bytes
    left) would have at ``now``: its MLU level or its RLI; and the positions
    (into ``idx``) of the explicit flows found infeasible (MLU > 1)."""
    out = rli(t.target[idx], current, t.stage[idx], levels)
    exp = t.explicit[idx]
    if not exp.any():
        return out, np.zeros(0, np.int64)
    e_idx = idx[exp]
    link = t.bneck_link[e_idx]
    rho = link_load[link] - explicit_load[link]
    m = mlu(remaining[exp], t.due[e_idx] - now, t.bneck_rate[e_idx], rho)
    out[exp] = level_of(m, thresholds)
    return out, np.flatnonzero(exp)[m > 1.0]


def explicit_load(load: np.ndarray, t: Rmlq, idx: np.ndarray, moved: np.ndarray, remaining: np.ndarray,
                  finished_bytes: np.ndarray, capacity: np.ndarray, dt: float, window: float) -> np.ndarray:
    """The explicit-traffic average per link after ``dt`` seconds (a new array):
    ``load <- u + (load - u) * exp(-dt / window)`` with u the utilization by
    the bytes the ``moved`` flows (of ``idx``) sent since their last decision,
    plus ``finished_bytes`` (flows that completed meanwhile), on each flow's
    bottleneck link, clipped to [0, 1]."""
    sent = (t.last_rem[idx[moved]] - remaining[moved]) * t.bneck_weight[idx[moved]]
    bytes_per_link = np.bincount(t.bneck_link[idx[moved]], weights=sent, minlength=len(capacity)) + finished_bytes
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        util = bytes_per_link / (capacity * dt)
    # A utilization is in [0, 1]; a vanishing interval or float dust must not say otherwise.
    util = np.clip(np.nan_to_num(util, nan=0.0, posinf=1.0), 0.0, 1.0)
    decay = math.exp(-dt / window)
    return util + (load - util) * decay


def scavenged(t: Rmlq, idx: np.ndarray, pruned: np.ndarray) -> np.ndarray:
    """Which flows (RMLQ slots) the scavenger class takes: a pruned request's
    own flows. A collective is the batch's, not its tag request's: demoting
    it would stall the batch's un-pruned requests, so pruning spares it."""
    return pruned[t.request[idx]] & (t.stage[idx] != _COLLECTIVE)


def arbitrate(t: Rmlq, idx: np.ndarray, pruned: np.ndarray, rank: np.ndarray, levels: int, dscp_codes: np.ndarray,
              compute_done: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None]:
    """(level, queue, DSCP, timer) of the flows at RMLQ slots ``idx``: queues
    from their urgency (``levels`` K: the scavenger), the engine's levels in
    host order (RED ``rank`` per batch), and the next period tick if an
    explicit flow past compute can still climb (None: no timer)."""
    explicit = t.explicit[idx]
    urgency = t.urgency[idx]
    queue = queue_of(urgency, explicit, scavenged(t, idx, pruned), levels)
    level = engine_levels(queue, explicit, urgency, rank[t.batch[idx]], levels)
    timer = t.next_timer(idx, compute_done & (queue < levels), now)
    return level, queue, dscp_codes[queue], timer
