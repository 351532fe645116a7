"""Minimal Link Utilization (MLU): urgency of explicit-deadline flows.

MFS §4.3. For a ``p2d`` flow with deadline (due time) ``d``::

    MLU = size_rem / (time_rem * B * (1 - rho)),   time_rem = d - now

the share of its bottleneck's residual capacity the flow needs to finish on
time. ``B`` is the flow's bottleneck rate alone (min over its links of
capacity / weight; a static property of its path) and ``rho`` the measured
load of that same link by the traffic a deferred deadline flow yields to:

    rho = link_load - explicit_load      (clipped to [0, 1])

``link_load`` is the engine's ``Snapshot.link_load``, an exponentially
weighted moving average of the link's utilization (time constant
``load_window``). ``explicit_load`` is the same average of the explicit-deadline
(p2d) traffic alone, which the ``mfs`` policy keeps from the bytes those flows
moved between its decisions (rates are constant in between, so the average
is exact; a flow's bytes are attributed to its bottleneck link only). With
equal windows the difference is the moving average of early-stage traffic.
Counting the deadline flows' own bytes would make a deferred flow that soaks
up idle capacity look urgent and promote it into the collectives it was
deferred for. rho = 1 or
``time_rem <= 0`` gives MLU = +inf. MLU > 1 means the flow cannot make its
deadline even with all residual capacity: it is *infeasible* (the ``mfs``
policy counts it and keeps it at the top level; it still has to be
delivered).

Threshold mapping (the paper's indices are loose; this is the one we use).
With K levels, level 0 the top, thresholds ``Q_j = U * E**-j`` for
``j = 0 .. K-2``::

    level 0      if MLU >= Q_0 = U
    level j      if Q_j <= MLU < Q_{j-1}      (1 <= j <= K-2)
    level K-1    if MLU < Q_{K-2}

So with the defaults (E = 4, U = 0.5) a flow reaches the top once it needs
half of its residual bottleneck, level 1 at 1/8, level 2 at 1/32, ... The
paper's Q_i = E^-i U (i >= 1) are our Q_1..Q_{K-1}; we add Q_0 = U as the top
threshold and drop Q_{K-1}, because admitting a flow to the reserved top at
only U/E = 12.5 % of the link finishes it far too early (Table 1's flow C
would then overtake the collective and make it miss). The mapping is
monotonic: a larger MLU (less slack) never maps to a lower-priority level.

Pure, vectorized functions; called by the ``mfs`` policy at admission and
at promotion points.
"""

from __future__ import annotations

import numpy as np


def thresholds(levels: int, E: float, U: float) -> np.ndarray:
    """Q_0 > Q_1 > ... > Q_{K-2}: the MLU at which each level is entered."""
    return U * np.power(float(E), -np.arange(levels - 1, dtype=float))


def mlu(remaining: np.ndarray, time_left: np.ndarray, bandwidth: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """MLU per flow; +inf where no time or no residual capacity is left."""
    residual = np.asarray(time_left, float) * np.asarray(bandwidth, float) * (1.0 - np.clip(rho, 0.0, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.asarray(remaining, float) / residual
    out[~(residual > 0)] = np.inf
    return out


def level_of(mlu_values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """RMLQ level (0 = top) for each MLU under thresholds ``q`` (descending)."""
    ascending = q[::-1]
    passed = np.searchsorted(ascending, np.asarray(mlu_values, float), side="right")  # thresholds <= MLU
    return (len(q) - passed).astype(np.int64)
