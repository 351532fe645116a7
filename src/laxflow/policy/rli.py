"""Relative Layer Index (RLI): urgency of implicit-deadline flows.

MFS §4.4.1. ``RLI = L_target - L_curr``: how many layers the request still
computes before it needs this flow's bytes. Smaller RLI first minimizes the
prefill makespan (Theorem 1). RLI is clipped to [0, K-1] (a flow whose target
layer is already being computed blocks it now: RLI 0; the paper caps at K-1
to fit the physical queues). ``collective`` flows block the current layer and
are RLI 0 by definition. A ``reuse`` flow whose target or current layer is
unknown gets K-1: flows enter low. A ``p2d`` flow reaching this function has
no deadline (those with one are ordered by MLU): it blocks nothing and has
nothing to meet, so it gets K-1 too, whatever its layer.

Pure, vectorized; called by the ``mfs`` policy (and the level arithmetic in
:mod:`laxflow.policy.arbitration`).
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.flow import STAGE_CODES, Stage

COLLECTIVE = STAGE_CODES[Stage.COLLECTIVE]
P2D = STAGE_CODES[Stage.P2D]


def rli(target: np.ndarray, current: np.ndarray, stage: np.ndarray, levels: int) -> np.ndarray:
    """RLI per flow, in [0, K-1]. ``target``/``current`` are floats, NaN = unknown."""
    diff = np.asarray(target, float) - np.asarray(current, float)
    out = np.full(diff.shape, levels - 1, dtype=np.int64)
    known = ~np.isnan(diff)
    out[known] = np.clip(diff[known], 0, levels - 1).astype(np.int64)
    stage = np.asarray(stage)
    out[stage == COLLECTIVE] = 0
    out[stage == P2D] = levels - 1
    return out
