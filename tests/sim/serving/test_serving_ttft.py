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
    takes the 7/8 of a GPU's bytes that go to its 7 peers at NVSwitch speed;
    layer j's KV (one GPU, TP1) goes over one 200 Gbps NIC while layer j+1
    computes; TTFT = L layers + the last layer's P2D.
    """
    tokens = 1000
    t, ep = _layer(tokens)
    layer = t.total + 2 * (ep * 7 / 8) / NVSWITCH
    p2d = tokens * KV_PER_TOKEN_LAYER / NIC
    assert p2d < layer  # so P2D transfers never queue behind each other
    expected = MODEL.num_layers * layer + p2d

    sim, res = run(create_config(servers=2), [create_request(0, 0.0, tokens)])
    state = res.states[0]
    assert state.ttft == pytest.approx(expected, rel=1e-9)
    assert state.idle_ttft == pytest.approx(expected, rel=1e-9)  # the SLO's closed form agrees
    assert state.slo == pytest.approx(3 * expected, rel=1e-9)
    assert res.batches[0].stall == 0.0
    assert sim.network.bytes_delivered_by_stage  # p2d went over the network
    assert sum(res.batches[0].cct) == pytest.approx(MODEL.num_layers * 2 * (ep * 7 / 8) / NVSWITCH, rel=1e-9)


def test_one_request_alone_cross_node_ep_blocks_compute():
    """The same unit over two 4-GPU servers: half of each all-to-all crosses NICs and blocks compute.

    By hand: a GPU sends ep/8 to each of its 4 remote peers (ep/2 through its
    NIC) and to each of its 3 local peers (3ep/8 over NVSwitch); every NIC
    carries 1/8 of the group's bytes in each direction, so the network part
    takes (ep/2)/NIC and the all-to-all max of that and the NVSwitch part.
    """
    tokens = 1000
    t, ep = _layer(tokens)
    coll = max((ep / 2) / NIC, (3 * ep / 8) / NVSWITCH)
    layer = t.total + 2 * coll
    p2d = tokens * KV_PER_TOKEN_LAYER / NIC
    assert p2d < t.total - t.experts  # a layer's P2D lands before the next dispatch starts
    expected = MODEL.num_layers * layer + p2d

    _, res = run(create_config(servers=4, gpus_per_server=4), [create_request(0, 0.0, tokens)])
    state = res.states[0]
    assert state.ttft == pytest.approx(expected, rel=1e-9)
    assert res.batches[0].cct == pytest.approx([2 * coll] * MODEL.num_layers, rel=1e-9)
    assert state.stall == pytest.approx(MODEL.num_layers * 2 * coll, rel=1e-9)  # non-overlapped communication


def test_two_requests_batch_together_and_share_the_layer_time():
    """Two requests arriving together form one batch (budget 8192) and finish with the same compute end."""
    _, res = run(create_config(servers=2), [create_request(0, 0.0, 800), create_request(1, 0.0, 600)])
    assert len(res.batches) == 1
    a, b = res.states
    assert a.compute_end == b.compute_end
    t = layer_compute_breakdown(MODEL, DEP, [800, 600], [800, 600]).total
    assert a.compute_end > MODEL.num_layers * t  # plus the all-to-alls


def test_token_budget_splits_batches_fcfs():
    reqs = [create_request(i, 0.0, 3000) for i in range(3)]
    _, res = run(create_config(servers=2, token_budget=6000), reqs)
    assert [len(b.states) for b in res.batches] == [2, 1]
    assert [s.id for s in res.batches[0].states] == ["r0", "r1"]
    assert res.states[2].batch_start >= res.states[0].compute_end
