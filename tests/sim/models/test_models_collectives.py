"""Stage-2 bytes per layer: the documented formulas on the paper's deployments."""

from __future__ import annotations

import pytest

from laxflow.sim.models import GPUS, Deployment, collective_bytes_per_layer, get_deployment, get_model


def test_ep_all_to_all_on_mixtral_8x22b() -> None:
    m, d = get_model("mixtral-8x22b"), get_deployment("mixtral-8x22b")
    c = collective_bytes_per_layer(m, d, 1000)
    # 1000 tokens x top-2 x 6144 x 2 B, to each of the 4 GPUs sharding an expert, spread over 32 GPUs.
    assert c.ep_dispatch_bytes == pytest.approx(1000 * 2 * 6144 * 2 * 4 / 32)
    assert c.ep_combine_bytes == c.ep_dispatch_bytes
    assert c.ep_remote_fraction == pytest.approx(31 / 32)
    assert c.ep_inter_node_fraction == pytest.approx(0.75)  # 8 of 32 GPUs share the sender's node
    assert c.sp_bytes == 0
    assert c.tp_bytes == pytest.approx(2 * 3 / 4 * (1000 / 8) * 6144 * 2)  # one all-reduce after attention
    assert c.tp_inter_node_fraction == 0  # TP4 stays inside an 8-GPU server


def test_ep_on_the_testbed_half_the_destinations_are_remote_nodes() -> None:
    m, d = get_model("mixtral-8x7b"), get_deployment("testbed-mixtral-8x7b")
    c = collective_bytes_per_layer(m, d, 4096)
    assert c.ep_dispatch_bytes == pytest.approx(4096 * 2 * 4096 * 2 / 8)
    assert c.ep_inter_node_fraction == pytest.approx(0.5)
    assert c.tp_bytes == 0
    assert c.inter_node_bytes == pytest.approx(2 * c.ep_dispatch_bytes * 0.5)


def test_sp_ring_moves_the_whole_context_including_reused_prefix() -> None:
    m, d = get_model("llama3-8b"), get_deployment("llama3-8b")
    c = collective_bytes_per_layer(m, d, 2000, context_tokens=10000)
    shard = 2 * (8 // 4) * 128 * 2
    assert c.sp_bytes == pytest.approx(3 / 4 * 10000 * shard)
    assert c.sp_inter_node_fraction == pytest.approx(0.5)  # ranks 0,1 on node 0; 2,3 on node 1
    assert c.ep_dispatch_bytes == 0
    assert c.tp_bytes == pytest.approx(2 * 2 * 3 / 4 * (2000 / 4) * 4096 * 2)  # two all-reduces, tokens / SP
    more = collective_bytes_per_layer(m, d, 2000, context_tokens=20000)
    assert more.sp_bytes == pytest.approx(2 * c.sp_bytes)


def test_tp_across_nodes_is_reported() -> None:
    m = get_model("llama3-8b")
    d = Deployment(name="tp16", model="llama3-8b", tp=16, gpus=16, gpu=GPUS["a100"], nic_gbps=200)
    c = collective_bytes_per_layer(m, d, 100)
    assert c.tp_inter_node_fraction == pytest.approx(2 / 16)  # ring hops 7->8 and 15->0


def test_no_collectives_on_one_gpu_and_bad_input() -> None:
    m = get_model("llama3-8b")
    d = Deployment(name="one", model="llama3-8b", gpus=1, gpu=GPUS["a100"], nic_gbps=200)
    c = collective_bytes_per_layer(m, d, 100)
    assert c.inter_node_bytes == 0 and c.tp_bytes == 0 and c.sp_bytes == 0
    with pytest.raises(ValueError):
        collective_bytes_per_layer(m, d, 100, context_tokens=50)
