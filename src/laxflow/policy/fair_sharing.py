"""Fair Sharing (FS): every flow in one level, max-min fair.

The baseline of the MFS paper's evaluation: the network's rate allocation
alone decides, with no priorities. Every flow is in queue 0 of its DSCP
map: one switch class.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot


class FairSharing(FlowPolicy):
    """One level for all flows; called by the engine after every event."""

    name = "fs"
    reads_link_load = False

    def decide(self, snap: Snapshot) -> Decision:
        return self.decision(np.zeros(len(snap.flows), dtype=np.int64))
