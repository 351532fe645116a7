"""Shortest Job First (SJF): strict priority by total flow size.

Smaller flows go first; the tie rule (``sjf_levels``, shared with Karuna's
SJF part) is: equal sizes by earlier arrival, and flows equal in both share
one level, max-min fair among themselves. No flow-id order enters (ids like
L0, L1, L10 would sort as strings and hand SJF part of another policy's
layer order), and the result does not depend on the engine's flow order.
The size is the flow's total size, not what remains: this is the size-based
baseline of the MFS paper, not SRPT.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot, rank_levels


def sjf_levels(size: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """SJF's strict-priority levels: dense rank of (size, then arrival); exact ties share a level."""
    return rank_levels([arrival, size])


class ShortestJobFirst(FlowPolicy):
    """Level = rank of (size, arrival); called by the engine after every event."""

    name = "sjf"
    reads_link_load = False

    def decide(self, snap: Snapshot) -> Decision:
        return self.decision(sjf_levels(snap.size, snap.arrival))
