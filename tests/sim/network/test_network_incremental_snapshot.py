"""The network engine hands a ``keeps_tags`` policy one incremental snapshot
object, its fields set anew for every decision: a column the policy read at
one decision (and the snapshot kept) is read again at the next, never
handed back from the one before, and no column can be read first after
``decide`` returned."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, FlowPolicy
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine


class ReadsColumns(FlowPolicy):
    """Reads the size, arrival and stage columns at every decision and checks them against the flows."""

    name = "test-reads-columns"
    keeps_tags = True

    def __init__(self) -> None:
        super().__init__()
        self.snaps: list = []
        self.checked = 0

    def decide(self, snap):
        flows = snap.flows
        assert snap.size.tolist() == [f.size for f in flows]
        assert snap.arrival.tolist() == [f.arrival for f in flows]
        assert len(snap.remaining) == len(snap.tag) == len(flows)
        self.snaps.append(snap)
        self.checked += 1
        n = len(flows)
        return self.decision(np.zeros(n, np.int64))


def test_columns_are_read_anew_at_every_decision():
    topo = leaf_spine(8, 2, 1e9)
    policy = ReadsColumns()
    net = FluidNetwork(topo, policy)
    for i in range(12):  # sizes and arrivals all different: a column kept from an earlier decision would differ
        flow = Flow.on_path(f"f{i}", 1e4 * (i + 1), topo.path(i % 8, (i + 3) % 8), arrival=1e-6 * i)
        net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    net.run()
    assert policy.checked > 12
    assert all(s is policy.snaps[0] for s in policy.snaps)  # (one object: the engine builds it once)
    with pytest.raises(RuntimeError, match="only be read first during decide"):
        policy.snaps[0].bottleneck_rate
