"""Fair Sharing (FS): every flow in one level, max-min fair.

The baseline of the MFS paper's evaluation: the network's rate allocation
alone decides, with no priorities. Every flow is in queue 0 of its DSCP
map: one switch class.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.dscp import DscpMap


class FairSharing(FlowPolicy):
    """One level for all flows; called by the engine after every event."""

    name = "fs"
    reads_link_load = False

    def __init__(self, dscp: DscpMap | None = None) -> None:
        super().__init__(dscp)
        # The answer depends on the flow count alone (the DSCP map is fixed at
        # construction), so one Decision per count is built once and returned
        # again: the engine calls decide after every event. Its arrays are
        # read-only views of one longer decision, so no reader can change what
        # later calls return, and the arrays of all counts together take
        # O(largest count) memory, not O(count) each.
        self._decisions: dict[int, Decision] = {}
        self._full: Decision | None = None  # all-zero levels for the largest count so far

    def decide(self, snap: Snapshot) -> Decision:
        n = len(snap.flows)
        d = self._decisions.get(n)
        return self._build(n) if d is None else d

    def _build(self, n: int) -> Decision:
        full = self._full
        if full is None or full.level.size < n:
            # Grown by doubling; decisions cached before keep viewing the shorter one, still right.
            size = max(n, 64, 0 if full is None else 2 * full.level.size)
            full = self._full = self.decision(np.zeros(size, dtype=np.int64))
            for a in (full.level, full.queue, full.dscp):
                a.flags.writeable = False
        d = self._decisions[n] = Decision(level=full.level[:n], queue=full.queue[:n], dscp=full.dscp[:n])
        return d
