"""The instance engine's second placement (``placement="cluster"``, ``fabric.instance_cluster``): instances as units
of a ClusterConfig-backed cluster, on consecutive GPUs, prefill instances first, --servers and --topology honoured."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.policy.flow import Stage
from laxflow.sim.models import get_deployment
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.instances import InstanceEngine, InstanceSimConfig
from laxflow.sim.serving.instances.fabric import Fabric, instance_cluster
from laxflow.sim.serving.instances.profile import StepTimer
from laxflow.sim.workload.request import Request

DEP = "llama3-8b-tp1-a800"


def _node(servers: int, per: int, topology: str = "big-switch") -> ClusterConfig:
    return ClusterConfig(servers=servers, gpus_per_server=per, nic_gbps=100.0, nvswitch_gbps=800.0,
                         topology=topology)


def _cfg(**kw) -> InstanceSimConfig:
    base = dict(deployment=DEP, instances=2, prefill_instances=1, scheduler="sarathi", router="dplb", ttft_slo=1.0,
                tpot_slo=0.1)
    return InstanceSimConfig(**{**base, **kw})


def _req(i: int, arrival: float, prompt: int, outputs: int) -> Request:
    return Request(id=f"r{i}", arrival=arrival, input_tokens=prompt, output_tokens=outputs)


def test_instances_take_consecutive_gpus_prefill_first():
    roles = [("i0", "prefill"), ("i1", "decode"), ("i2", "prefill"), ("i3", "decode")]
    cluster, gpus = instance_cluster(_node(2, 2), roles, 1)
    assert gpus == {"i0": (0,), "i2": (1,), "i1": (2,), "i3": (3,)}  # prefill instances first, in engine order
    assert [(u.name, u.gpus) for u in cluster.prefill_units] == [("p0", (0,)), ("p1", (1,))]
    assert [(u.name, u.gpus) for u in cluster.decode_units] == [("d0", (2,)), ("d1", (3,))]
    assert cluster.config.servers == 2 and cluster.topology.num_nics == 4  # --servers x GPUs, one NIC per GPU
    assert [cluster.server_of(g) for g in range(4)] == [0, 0, 1, 1]


def test_a_tp2_instance_sends_its_kv_as_per_gpu_pairs():
    cluster, gpus = instance_cluster(_node(2, 2), [("i0", "prefill"), ("i1", "decode")], 2)
    assert gpus == {"i0": (0, 1), "i1": (2, 3)}
    fabric = Fabric(None, None, cluster, 800e9 / 8)  # shapes only: no queue or network needed
    shape = fabric.move(Stage.P2D, 1e9, gpus["i0"], gpus["i1"])
    assert shape.net == pytest.approx(1e9) and shape.size == pytest.approx(5e8)  # two NICs, one pair each
    assert not shape.intra_event


def test_the_topology_is_the_configs():
    cluster, _ = instance_cluster(_node(4, 2, "fat-tree"), [("i0", "colocated")], 1)
    assert cluster.topology.num_nics == 8 and cluster.prefill_units[0].gpus == (0,) and cluster.decode_units == []


def test_too_few_servers_or_a_straddling_instance_is_one_error():
    with pytest.raises(UserError, match=r"--servers: 5 instances of 1 GPUs need 5 GPUs, but 2 servers x 2 GPUs"):
        instance_cluster(_node(2, 2), [(f"i{k}", "prefill") for k in range(5)], 1)
    with pytest.raises(UserError, match="--servers: an instance of 3 GPUs neither fits"):
        instance_cluster(_node(4, 4), [("i0", "prefill"), ("i1", "decode")], 3)
    with pytest.raises(UserError, match="--servers: an instance of 6 GPUs neither fits .* nor spans whole servers"):
        instance_cluster(_node(4, 4), [("i0", "prefill"), ("i1", "decode")], 6)
    # Wider than a server: whole servers each (a prefill unit's EP group across servers).
    cluster, gpus = instance_cluster(_node(4, 4), [("i0", "prefill"), ("i1", "decode")], 8)
    assert gpus == {"i0": tuple(range(8)), "i1": tuple(range(8, 16))}
    assert {cluster.server_of(g) for g in gpus["i0"]} == {0, 1} and {cluster.server_of(g) for g in gpus["i1"]} == {2, 3}
    with pytest.raises(UserError, match=r"placement: unknown 'rack' \(expected one of ports, cluster\)"):
        _cfg(placement="rack")


def test_tp1_one_gpu_servers_on_a_big_switch_equal_the_port_placement():
    reqs = [_req(i, 0.02 * i, 800 + 300 * i, 5) for i in range(6)]
    node = ClusterConfig(servers=4, gpus_per_server=1, topology="big-switch")  # NIC, NVSwitch: the deployment's
    ports = InstanceEngine(_cfg(instances=4, prefill_instances=2), reqs)
    placed = InstanceEngine(_cfg(instances=4, prefill_instances=2, placement="cluster", cluster=node), reqs)
    assert placed.gpus == ports.gpus == {"i0": (0,), "i1": (1,), "i2": (2,), "i3": (3,)}
    a, b = ports.run(), placed.run()
    assert [s.token_times for s in a.seqs] == [s.token_times for s in b.seqs]
    assert a.network_events == b.network_events > 0 and a.p2d_bytes == b.p2d_bytes


def test_two_instances_on_one_server_move_kv_over_nvswitch():
    node = ClusterConfig(servers=2, topology="big-switch")  # the deployment's 8-GPU A800 server: i0, i1 on server 0
    eng = InstanceEngine(_cfg(placement="cluster", cluster=node), [_req(0, 0.0, 2000, 3)])
    res = eng.run()
    s, t, dep = res.seqs[0], StepTimer(DEP), get_deployment(DEP)
    kv = 2000 * t.kv_bytes_per_token()
    nvswitch = dep.intra_node_gbps * 1e9 / 8
    assert s.token_times[0] == s.kv_landed == pytest.approx(s.prefill_end + kv / nvswitch, rel=1e-9)
    assert s.token_times[1] == pytest.approx(s.prefill_end + kv / nvswitch + t.seconds([(1, 2000)]), rel=1e-9)
    assert res.network_events == 0 and eng.fabric.delivered["p2d"] == 0.0 and res.p2d_bytes == kv
