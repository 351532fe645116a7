"""instances/fabric.py on hand-checked clusters: a transfer's network and NVSwitch parts, bytes per stage, the
instance engine's placement and --network ideal."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.policy.flow import Stage
from laxflow.policy.registry import create_policy
from laxflow.sim.events import EventQueue
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.instances.fabric import Fabric, IdealFabric, create_fabric, instance_ports

NIC = 100.0  # Gbit/s per NIC
NVS = 800.0  # Gbit/s per GPU over NVSwitch


def _fabric() -> Fabric:
    config = ClusterConfig(servers=2, gpus_per_server=2, nic_gbps=NIC, nvswitch_gbps=NVS, topology="big-switch")
    cluster = Cluster(config, prefill_unit_gpus=2)
    queue = EventQueue()
    network = FluidNetwork(cluster.topology, create_policy("fs"), queue, flow_fields=False)
    return Fabric(queue, network, cluster, config.nvswitch_bytes_per_s)


def _run(fabric: Fabric, fid: str, shape, live: dict) -> tuple[int, list[float]]:
    landed: list[float] = []
    parts = fabric.issue(fid, shape, 3, 10.0, 0.5, "r0", "b0", 1, False, live,
                         lambda _arg: landed.append(fabric.queue.now), None)
    fabric.queue.run()
    return parts, landed


def test_cross_server_move_is_one_flow_group_in_per_pair_units():
    fabric = _fabric()
    shape = fabric.move(Stage.P2D, 1e9, (0, 1), (2, 3))  # GPU k -> GPU 2+k, both pairs across the network
    assert shape.net == pytest.approx(1e9) and shape.size == pytest.approx(5e8)  # 2 pairs
    assert not shape.intra_event and shape.key == "p2d"
    live: dict = {}
    parts, landed = _run(fabric, "r0.L3.p2d", shape, live)
    assert parts == 1 and live == {}  # the flow left ``live`` when it landed
    assert landed == [pytest.approx(1e9 / (2 * NIC * 1e9 / 8))]  # two NICs in parallel
    assert fabric.delivered == {"reuse": 0.0, "collective": 0.0, "p2d": pytest.approx(1e9)}


def test_flow_carries_the_transfer_fields():
    fabric = _fabric()
    live: dict = {}
    fabric.issue("f", fabric.move(Stage.REUSE, 1e6, (0,), (2,)), 3, 10.0, 0.5, "r0", "b0", 1, False, live,
                 lambda _arg: None, None)
    (flow,) = live.values()
    assert (flow.id, flow.stage, flow.request, flow.batch, flow.layer, flow.current_layer) == \
        ("f", Stage.REUSE, "r0", "b0", 3, 1)
    assert flow.deadline == 10.0 and flow.downstream == 0.5 and flow.compute_done is False
    fabric.queue.run()
    assert fabric.delivered["reuse"] == pytest.approx(1e6)


def test_same_server_move_rides_nvswitch_and_moves_no_network_byte():
    fabric = _fabric()
    shape = fabric.move(Stage.P2D, 1e9, (0,), (1,))
    assert shape.net == 0.0 and shape.intra_event
    parts, landed = _run(fabric, "x", shape, {})
    assert parts == 1 and landed == [pytest.approx(1e9 / (NVS * 1e9 / 8))]
    assert fabric.delivered["p2d"] == 0.0 and fabric.network.events == 0


def test_a_move_within_one_gpu_costs_nothing_and_calls_nothing():
    fabric = _fabric()
    parts, landed = _run(fabric, "x", fabric.move(Stage.P2D, 1e9, (0,), (0,)), {})
    assert parts == 0 and landed == []


def test_instance_ports_give_each_instance_one_server_and_one_port():
    cluster, gpus = instance_ports(["i0", "i1", "i2"], 25e9)
    assert gpus == {"i0": (0,), "i1": (1,), "i2": (2,)} and cluster.config is None
    assert [cluster.server_of(g) for g in range(3)] == [0, 1, 2] and cluster.prefill_units == []
    queue = EventQueue()
    fabric = Fabric(queue, FluidNetwork(cluster.topology, create_policy("fs"), queue, flow_fields=False), cluster, 1e12)
    shape = fabric.move(Stage.P2D, 5e9, gpus["i2"], gpus["i0"])
    assert (shape.net, shape.size, shape.intra_event) == (5e9, 5e9, False)  # one flow: the whole KV, port to port
    assert sorted(cluster.topology.link_ids[i] for i in shape.links) == ["nic0.in", "nic2.out"]
    _, landed = _run(fabric, "r0.kv", shape, {})
    assert landed == [pytest.approx(5e9 / 25e9)]


def test_ideal_fabric_lands_every_transfer_at_once_and_still_counts_its_bytes():
    config = ClusterConfig(servers=2, gpus_per_server=2, nic_gbps=NIC, nvswitch_gbps=NVS, topology="big-switch")
    cluster = Cluster(config, prefill_unit_gpus=2)
    queue = EventQueue()
    queue.push(1.5, 0, lambda: None)
    queue.run()  # now = 1.5
    fabric = create_fabric("ideal", queue, FluidNetwork(cluster.topology, create_policy("fs"), queue), cluster,
                           config.nvswitch_bytes_per_s)
    assert isinstance(fabric, IdealFabric)
    for src, dst in (((0, 1), (2, 3)), ((0,), (1,))):  # across the network; over NVSwitch
        live: dict = {}
        parts, landed = _run(fabric, "x", fabric.move(Stage.P2D, 1e9, src, dst), live)
        assert parts == 1 and landed == [1.5] and live == {}
    assert fabric.delivered["p2d"] == pytest.approx(1e9) and fabric.network.events == 0
    assert _run(fabric, "x", fabric.move(Stage.P2D, 1e9, (0,), (0,)), {}) == (0, [])
    with pytest.raises(UserError, match=r"--network: unknown 'free' \(expected one of fabric, ideal\)"):
        create_fabric("free", queue, fabric.network, cluster, 1.0)
