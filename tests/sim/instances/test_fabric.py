"""instances/fabric.py on a hand-checked 2-server cluster: a transfer's network part, NVSwitch part, bytes per stage."""

from __future__ import annotations

import pytest

from laxflow.policy.flow import Stage
from laxflow.policy.registry import create_policy
from laxflow.sim.events import EventQueue
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.instances.fabric import Fabric

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
