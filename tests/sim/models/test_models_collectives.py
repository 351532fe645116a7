"""Stage-2 bytes per layer: the documented formulas on the paper's deployments."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.sim.models import GPUS, Deployment, collective_bytes_per_layer, ep_node_hits, get_deployment, get_model


def test_ep_hierarchical_on_mixtral_8x22b_tp4_ep8() -> None:
    """By hand: 32 GPUs on 4 nodes of 8; expert i on GPUs 4i..4i+3, so every node hosts 2 of the 8 experts.

    A token's top-2 experts miss a given node with probability C(6,2)/C(8,2) = 15/28, so it crosses the
    network to each of the 3 other nodes with probability 13/28: 39/28 hidden vectors per token and
    direction, against 2 x 4 x 24/32 = 6 when every (token, expert) pair went to each of the expert's
    4 GPUs (4.3x more).
    """
    m, d = get_model("mixtral-8x22b"), get_deployment("mixtral-8x22b")
    c = collective_bytes_per_layer(m, d, 1000)
    vec = 6144 * 2
    assert ep_node_hits(m, d) == pytest.approx([13 / 28] * 4)
    assert c.ep_dispatch_bytes == pytest.approx(1000 * vec / 32)  # each GPU dispatches its 1/32 of the tokens
    assert c.ep_combine_bytes == c.ep_dispatch_bytes
    assert c.ep_inter_node_fraction == pytest.approx(39 / 28)
    per_token = c.inter_node_bytes * 32 / 1000 / 2  # whole unit, per token, one direction
    assert per_token == pytest.approx(39 / 28 * vec)
    assert 6 * vec / per_token == pytest.approx(4.31, abs=0.01)
    assert c.sp_bytes == 0
    assert c.tp_bytes == pytest.approx(2 * 3 / 4 * (1000 / 8) * 6144 * 2)  # one all-reduce after attention
    assert c.tp_inter_node_fraction == 0  # TP4 stays inside an 8-GPU server


def test_ep_hierarchical_on_dbrx_tp2_ep16() -> None:
    """By hand: 16 experts on groups of 2 GPUs, 4 experts per 8-GPU node, top-4.

    Miss a node: C(12,4)/C(16,4) = 495/1820, so 3 x 1325/1820 = 2.184 vectors per token and direction
    cross the network, against 4 x 2 x 24/32 = 6 pair-wise (2.75x more).
    """
    m, d = get_model("dbrx"), get_deployment("dbrx")
    c = collective_bytes_per_layer(m, d, 2048)
    vec = 6144 * 2
    per_token = c.inter_node_bytes * 32 / 2048 / 2
    assert per_token == pytest.approx(3 * 1325 / 1820 * vec)
    assert 6 * vec / per_token == pytest.approx(2.747, abs=0.001)
    assert c.tp_bytes == pytest.approx(2 * 1 / 2 * (2048 / 16) * vec)


def test_ep_on_the_testbed_is_vllm_allgather_reducescatter() -> None:
    """The testbed's vLLM DP+EP all-gathers every token to every GPU: a ring over 8 GPUs on 2 nodes."""
    m, d = get_model("mixtral-8x7b"), get_deployment("testbed-mixtral-8x7b")
    c = collective_bytes_per_layer(m, d, 4096)
    assert d.ep_comm == "allgather"
    assert c.ep_dispatch_bytes == pytest.approx(7 / 8 * 4096 * 4096 * 2)
    assert c.ep_inter_node_fraction == pytest.approx(2 / 8)  # ring hops 3->4 and 7->0 change node
    assert c.tp_bytes == 0
    assert c.inter_node_bytes == pytest.approx(2 * c.ep_dispatch_bytes * 2 / 8)


def test_bad_ep_comm_is_one_clear_error() -> None:
    with pytest.raises(UserError, match="ep_comm"):
        Deployment(name="x", model="mixtral-8x7b", tp=1, ep=8, gpus=8, gpu=GPUS["a100"], nic_gbps=200, ep_comm="mesh")


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
