"""Baseline policies fs, sjf, edf: their levels, and Table 1 through the engine."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage, create_policy
from laxflow.policy.edf import EarliestDeadlineFirst
from laxflow.policy.fair_sharing import FairSharing
from laxflow.policy.sjf import ShortestJobFirst
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, Topology


def snapshot(flows: list[Flow], now: float = 0.0) -> Snapshot:
    n = len(flows)
    return Snapshot(now=now, flows=flows, remaining=np.array([f.size for f in flows]), capacity=np.ones(1), link_load=np.zeros(1), load_window=0.01)


def flow(id: str, size: float = 1.0, **kw) -> Flow:
    return Flow.on_path(id, size, [0], **kw)


def test_registry_names():
    assert isinstance(create_policy("fs"), FairSharing)
    assert isinstance(create_policy("sjf"), ShortestJobFirst)
    assert isinstance(create_policy("edf"), EarliestDeadlineFirst)
    assert isinstance(create_policy("laxflow.policy.sjf:ShortestJobFirst"), ShortestJobFirst)


def test_fs_puts_everything_in_one_level():
    d = create_policy("fs").decide(snapshot([flow("a"), flow("b", 5.0)]))
    assert list(d.level) == [0, 0] and d.cap is None


def test_sjf_orders_by_size_then_arrival_and_exact_ties_share_a_level():
    flows = [flow("z", 3.0), flow("b", 2.0, arrival=1.0), flow("a", 2.0, arrival=1.0), flow("c", 2.0, arrival=0.5),
             flow("L10", 1.0), flow("L2", 1.0)]
    level = create_policy("sjf").decide(snapshot(flows)).level
    # L10 = L2 (1, 0: no id order) < c (2, 0.5) < a = b (2, 1) < z (3)
    assert list(level) == [3, 2, 2, 1, 0, 0]
    # Karuna's SJF part (flows without an explicit deadline) uses the same rule, one level lower.
    karuna = create_policy("karuna").decide(snapshot(flows)).level
    assert list(karuna) == [4, 3, 3, 2, 1, 1]


def test_group_variants_size_a_collective_as_its_whole_group():
    # An all-to-all over 16 pairs (1 byte per pair: 16 bytes) against a lone 4-byte transfer.
    flows = [flow("a2a", 1.0, stage=Stage.COLLECTIVE, pairs=16.0), flow("kv", 4.0, stage=Stage.REUSE)]
    assert list(create_policy("sjf").decide(snapshot(flows)).level) == [0, 1]  # per pair: the all-to-all is small
    assert list(create_policy("sjf-group").decide(snapshot(flows)).level) == [1, 0]  # whole: it is the big job
    assert list(create_policy("karuna").decide(snapshot(flows)).level) == [1, 2]
    assert list(create_policy("karuna-group").decide(snapshot(flows)).level) == [2, 1]
    assert Flow.trusted("t", 1.0, np.zeros(1, np.int64), np.ones(1), pairs=16.0).pairs == 16.0
    assert flow("plain").pairs == 1.0


def test_a_collectives_flow_carries_its_pairs_from_the_fabric():
    from laxflow.sim.serving.config import ClusterConfig
    from laxflow.sim.serving.cluster import Cluster
    from laxflow.sim.serving.instances.fabric import Fabric
    from laxflow.sim.events import EventQueue

    cluster = Cluster(ClusterConfig(servers=2, gpus_per_server=2, nic_gbps=100.0, nvswitch_gbps=7200.0,
                                    topology="big-switch"), 2)
    queue = EventQueue()
    net = FluidNetwork(cluster.topology, create_policy("sjf-group"), queue)
    fabric = Fabric(queue, net, cluster, 900e9)
    pattern = cluster.transfer([0, 1], [2, 3])  # two GPU pairs across the two servers
    shape = fabric.shape(Stage.P2D, 1e6, pattern)
    seen = []
    add = net.add_flow
    net.add_flow = lambda f, done=None: (seen.append(f), add(f, done))[1]
    fabric.issue("x", shape, None, None, 0.0, "r", "b", None, True, {}, lambda _: None, None)
    assert seen[0].pairs == pattern.pairs == 2 and seen[0].size * seen[0].pairs == shape.net == 1e6


def test_sjf_uses_total_size_not_remaining():
    flows = [flow("big", 10.0), flow("small", 2.0)]
    snap = snapshot(flows)
    snap.remaining = np.array([0.5, 2.0])
    assert list(create_policy("sjf").decide(snap).level) == [1, 0]


def test_edf_explicit_deadlines_first_then_the_rest_share_the_lowest_level():
    flows = [
        flow("reuse", stage=Stage.REUSE, deadline=1.0),  # implicit: stage 1
        flow("late", stage=Stage.P2D, deadline=9.0),
        flow("coll", stage=Stage.COLLECTIVE, deadline=2.0),  # implicit: stage 2
        flow("early", stage=Stage.P2D, deadline=5.0, downstream=1.0),  # due 4
        flow("nodl", stage=Stage.P2D),  # no deadline
        flow("tie", stage=Stage.P2D, deadline=4.0, arrival=1.0),  # due 4, later arrival
    ]
    level = create_policy("edf").decide(snapshot(flows)).level
    assert dict(zip((f.id for f in flows), level.tolist())) == {
        "early": 0, "tie": 1, "late": 2, "reuse": 3, "coll": 3, "nodl": 3,
    }  # fmt: skip


def run_table1(policy: str) -> dict[str, float]:
    net = FluidNetwork(Topology.from_links(["L"], [1.0]), create_policy(policy))
    flows = [
        flow("A", 2.0, stage=Stage.REUSE, deadline=18.0, downstream=9.0),
        flow("B", 4.0, stage=Stage.COLLECTIVE, deadline=12.0, downstream=6.0),
        flow("C", 3.0, stage=Stage.P2D, deadline=7.0),
    ]
    for f in flows:
        net.queue.push(0.0, Priority.ARRIVAL, net.add_flow, f)
    net.run()
    return {f.id: f.finish for f in flows}


@pytest.mark.parametrize(
    "policy, expect",
    [("fs", {"A": 6.0, "B": 9.0, "C": 8.0}), ("sjf", {"A": 2.0, "B": 9.0, "C": 5.0}), ("edf", {"A": 7.0, "B": 9.0, "C": 3.0})],
)
def test_table1(policy, expect):
    assert run_table1(policy) == expect
