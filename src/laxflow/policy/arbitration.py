"""MFS arbitration (§4.5): from per-flow urgency to queues and host order.

Level layout with K RMLQ levels (default 8), level 0 served first:

====================  =========================================================
RMLQ level (queue)    who
====================  =========================================================
0 (top, reserved)     explicit-deadline (``p2d`` with deadline) flows at MLU
                      level 0: MLU >= U, the most urgent
q = 1 .. K-1          implicit-deadline flows with ``min(1 + RLI, K-1) = q``
                      (RLI 0 = collectives and blocking reuse in queue 1), then
                      explicit-deadline flows at MLU level q
K (scavenger)         a pruned request's own flows (reuse, p2d); a
                      collective keeps its level: it carries the batch
====================  =========================================================

So the MLU levels and the RLI levels interleave: queue q holds RLI q-1 and
MLU level q. Inside one queue early-stage (implicit) flows go before
last-stage (explicit) ones; among early-stage flows a smaller RLI goes first
(RLI K-2 and K-1 share the bottom queue, the host still orders them) and
equal RLI follows the batch's RED rank. The queue is what the DSCP map tags
(:mod:`laxflow.policy.dscp`); the host's strict order inside it is finer,
which is the paper's hybrid enforcement (software strict priority on the
host, DSCP classes in the fabric).

The engine gets that host order as dense levels: every distinct key
``(queue, explicit, RLI, RED rank)`` is one engine level (explicit flows of a
queue share one, max-min fair), scavenger last. Called by the ``mfs`` policy
on every decision; vectorized.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import rank_levels


def queue_of(urgency: np.ndarray, explicit: np.ndarray, pruned: np.ndarray, levels: int) -> np.ndarray:
    """RMLQ level per flow from its stored urgency (MLU level or RLI)."""
    q = np.where(explicit, urgency, np.minimum(urgency + 1, levels - 1))
    return np.where(pruned, levels, q).astype(np.int64)


def engine_levels(
    queue: np.ndarray, explicit: np.ndarray, urgency: np.ndarray, batch_rank: np.ndarray, levels: int
) -> np.ndarray:
    """Dense strict-priority levels for the engine (0 first) in host order."""
    if len(queue) == 0:
        return np.zeros(0, dtype=np.int64)
    # Explicit flows of one queue, and all scavenger flows, share one level;
    # implicit flows are split further by RLI and RED rank.
    fine = ~explicit & (queue < levels)
    rli_key = np.where(fine, urgency, 0)
    rank_key = np.where(fine, batch_rank, 0)
    explicit_key = (explicit & (queue < levels)).astype(np.int8)
    return rank_levels([rank_key, rli_key, explicit_key, queue])
