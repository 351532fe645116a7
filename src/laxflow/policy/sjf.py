"""Shortest Job First (SJF): strict priority by total flow size.

Smaller flows go first; ties by arrival, then by flow id, so every flow has a
level of its own and the order is total (deterministic whatever the engine's
order). The size is the flow's total size, not what remains: this is the
size-based baseline of the MFS paper, not SRPT.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot, rank_levels


class ShortestJobFirst(FlowPolicy):
    """Level = rank of (size, arrival, id); called by the engine after every event."""

    name = "sjf"

    def decide(self, snap: Snapshot) -> Decision:
        ids = np.array([f.id for f in snap.flows], dtype=object)
        id_rank = np.empty(len(ids), dtype=np.int64)
        id_rank[np.argsort(ids, kind="stable")] = np.arange(len(ids))
        return self.decision(rank_levels([id_rank, snap.arrival, snap.size]))
