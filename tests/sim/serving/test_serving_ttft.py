"""TTFT of one request alone, computed by hand from the model's numbers, against the simulator."""

from __future__ import annotations

import pytest
from serving_factories import create_config, create_request, run

from laxflow.sim.models import collective_bytes_per_layer, get_deployment, get_model, layer_compute_breakdown

MODEL = get_model("mixtral-8x7b")
DEP = get_deployment("mixtral-8x7b")  # TP1 EP8 on 8 GPUs
NIC = 200e9 / 8  # bytes/s
NVSWITCH = 900e9  # bytes/s per GPU
KV_PER_TOKEN_LAYER = 2 * MODEL.num_kv_heads * MODEL.head_dim * MODEL.dtype_bytes  # tp = 1: one GPU holds it


def _layer(tokens: int):
    t = layer_compute_breakdown(MODEL, DEP, [tokens], [tokens])
    ep = collective_bytes_per_layer(MODEL, DEP, tokens).ep_dispatch_bytes  # per GPU, = combine
    return t, ep


def test_one_request_alone_intra_node_ep():
    """A unit on one 8-GPU server: all-to-alls ride NVSwitch; only the P2D crosses the network.

    By hand: each layer = compute + dispatch + combine, where each all-to-all
    hands each of a GPU's ep = T H b / 8 bytes of hidden vectors to its top-2
    experts' GPUs, 7/8 of them peers, at NVSwitch speed;
    layer j's KV (one GPU, TP1) goes over one 200 Gbps NIC while layer j+1
    computes; TTFT = L layers + the last layer's P2D.
    """
    tokens = 1000
    t, ep = _layer(tokens)
    layer = t.total + 2 * (ep * 2 * 7 / 8) / NVSWITCH
    p2d = tokens * KV_PER_TOKEN_LAYER / NIC
    assert p2d < layer  # so P2D transfers never queue behind each other
    expected = MODEL.num_layers * layer + p2d

    sim, res = run(create_config(servers=2), [create_request(0, 0.0, tokens)])
    state = res.states[0]
    assert state.ttft == pytest.approx(expected, rel=1e-9)
    assert state.idle_ttft == pytest.approx(expected, rel=1e-9)  # the SLO's closed form agrees
    assert state.slo == pytest.approx(3 * expected, rel=1e-9)
    assert res.batches[0].stall == 0.0
    # Only the P2D crossed the network: the whole context's KV, every layer, one GPU's shard (TP1).
    assert res.stage_bytes_delivered["p2d"] == pytest.approx(tokens * KV_PER_TOKEN_LAYER * MODEL.num_layers)
    assert res.stage_bytes_delivered["collective"] == 0 and res.stage_bytes_delivered["reuse"] == 0
    assert sum(res.batches[0].cct) == pytest.approx(MODEL.num_layers * 2 * (ep * 2 * 7 / 8) / NVSWITCH, rel=1e-9)


def test_one_request_alone_cross_node_ep_blocks_compute():
    """The same unit over two 4-GPU servers: hierarchical dispatch/combine cross NICs and block compute.

    By hand: each GPU dispatches ep = T H b / 8 bytes of hidden vectors. The other server hosts 4 of
    the 8 experts, so a token's top-2 hit it with probability 1 - C(4,2)/C(8,2) = 22/28, and each GPU
    sends ep * 22/28 through its NIC to its peer of the same local rank there (one pair per GPU, every
    NIC alike); the NVSwitch fan-out moves ep * top_k * expert_tp * (1 - 1/4) per GPU in parallel.
    """
    tokens = 1000
    t, ep = _layer(tokens)
    assert ep == pytest.approx(tokens * MODEL.hidden * 2 / 8)
    coll = max(ep * 22 / 28 / NIC, ep * 2 * 1 * 3 / 4 / NVSWITCH)
    layer = t.total + 2 * coll
    p2d = tokens * KV_PER_TOKEN_LAYER / NIC
    assert p2d < t.total - t.experts  # a layer's P2D lands before the next dispatch starts
    expected = MODEL.num_layers * layer + p2d

    _, res = run(create_config(servers=4, gpus_per_server=4), [create_request(0, 0.0, tokens)])
    state = res.states[0]
    assert state.ttft == pytest.approx(expected, rel=1e-9)
    assert res.batches[0].cct == pytest.approx([2 * coll] * MODEL.num_layers, rel=1e-9)
    assert res.batches[0].idle_cct == pytest.approx(2 * coll, rel=1e-9)  # alone: CCT inflation 1
    assert state.stall == pytest.approx(MODEL.num_layers * 2 * coll, rel=1e-9)  # non-overlapped communication
    assert res.stage_bytes_delivered["collective"] == pytest.approx(2 * 8 * ep * 22 / 28 * MODEL.num_layers)


def test_two_requests_batch_together_and_share_the_layer_time():
    """Two requests arriving together form one batch (budget 8192) and finish with the same compute end."""
    _, res = run(create_config(servers=2), [create_request(0, 0.0, 800), create_request(1, 0.0, 600)])
    assert len(res.batches) == 1
    a, b = res.states
    assert a.compute_end == b.compute_end
    t = layer_compute_breakdown(MODEL, DEP, [800, 600], [800, 600]).total
    assert a.compute_end > MODEL.num_layers * t  # plus the all-to-alls


def test_each_attention_rank_has_its_own_token_budget():
    """TP1 EP8: 8 attention-DP ranks, each batching up to ``token_budget`` new tokens of its own queue.

    Nine 3000-token requests join the least loaded rank (r0..r7 on ranks 0..7, r8 on rank 0 again):
    the first step runs eight 3000-token rank batches together (24,000 tokens, more than one budget),
    r8 does not fit rank 0's 5000-token budget beside r0 and waits for the next step; the layer time
    is that of the per-rank groups (one request each), not of a single 5000-token batch.
    """
    reqs = [create_request(i, 0.0, 3000) for i in range(9)]
    _, res = run(create_config(servers=2, token_budget=5000), reqs)
    assert [len(b.states) for b in res.batches] == [8, 1]
    assert [s.rank for s in res.states] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    assert res.states[8].batch_start >= res.states[0].compute_end
    first = res.batches[0]
    per_rank = layer_compute_breakdown(MODEL, DEP, [3000] * 8, [3000] * 8, groups=list(range(8))).total
    assert first.plan.compute == pytest.approx(per_rank, rel=1e-12)
    # Balanced ranks: the step costs less than 8x one request's layer (the experts batch all tokens).
    assert per_rank < 8 * layer_compute_breakdown(MODEL, DEP, [3000], [3000]).total
    # Each request's P2D leaves from its own rank's GPU (TP1: GPU = rank).
    assert [s.bytes["p2d"] for s in first.states] == pytest.approx([3000 * KV_PER_TOKEN_LAYER * MODEL.num_layers] * 8)
