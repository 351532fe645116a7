"""Earliest Deadline First (EDF), as the MFS paper's baseline runs it.

Flows with an explicit deadline (stage-3 p2d flows whose request has a TTFT
deadline) go first, one level each, in order of their due time
(``deadline - downstream``; ties by arrival, then id). Every other flow has
only an implicit deadline, which EDF cannot see, so they all share the lowest
level, max-min fair (MFS §6: "it applies fair sharing for flows with implicit
deadlines").
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot, rank_levels


class EarliestDeadlineFirst(FlowPolicy):
    """Explicit-deadline flows by due time, then the rest fair-shared; called after every event."""

    name = "edf"
    reads_link_load = False

    def decide(self, snap: Snapshot) -> Decision:
        n = len(snap.flows)
        level = np.zeros(n, dtype=np.int64)
        explicit = np.flatnonzero(snap.explicit)
        if explicit.size:
            ids = np.array([snap.flows[i].id for i in explicit], dtype=object)
            id_rank = np.empty(explicit.size, dtype=np.int64)
            id_rank[np.argsort(ids, kind="stable")] = np.arange(explicit.size)
            level[explicit] = rank_levels([id_rank, snap.arrival[explicit], snap.due[explicit]])
        level[~snap.explicit] = explicit.size
        return self.decision(level)
