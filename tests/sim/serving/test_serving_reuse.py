"""Stage-1 reuse: routing to a remote holder, compute blocked until the layer's KV lands, bytes per stage."""

from __future__ import annotations

import pytest
from serving_factories import BLOCK, create_config, create_request, run

from laxflow.sim.models import get_model

MODEL = get_model("mixtral-8x7b")
NIC = 200e9 / 8
KV = 2 * MODEL.num_kv_heads * MODEL.head_dim * MODEL.dtype_bytes  # per token per layer, TP1
PREFIX = tuple(range(1000, 1064))  # 64 blocks = 1024 tokens


def _workload():
    """r0 caches PREFIX on unit 0; r1 loads unit 0; r2 shares PREFIX, goes to idle unit 1 and fetches it."""
    return [
        create_request(0, 0.0, 64 * BLOCK, PREFIX),
        create_request(1, 1.0, 8000),
        create_request(2, 1.0, 74 * BLOCK, PREFIX),
    ]


def _reuse_run(policy="fs", **kw):
    kw.setdefault("kv_placement", "local-cache")
    sim, res = run(create_config(servers=4, **kw), _workload(), policy)
    return sim, res, res.states[2]


def test_router_sends_to_idle_unit_and_fetches_remote_prefix():
    _, res, r2 = _reuse_run()
    assert res.states[1].route.prefill == 0  # tie on an idle cluster: lowest index
    assert (r2.route.prefill, r2.route.holder) == (1, 0)
    assert (r2.route.local_tokens, r2.route.remote_tokens) == (0, 64 * BLOCK)
    assert r2.new_tokens == 10 * BLOCK


def test_reuse_blocks_compute_until_the_layer_has_landed():
    """FS shares one NIC among all layers' fetches, so layer 0 waits for all of them to land together."""
    _, res, r2 = _reuse_run()
    per_layer = 64 * BLOCK * KV
    batch = res.batches[r2.batch]
    assert batch.stall == pytest.approx(MODEL.num_layers * per_layer / NIC, rel=1e-9)
    assert r2.ttft > batch.stall + MODEL.num_layers * batch.plan.compute


def test_smallest_rli_first_hides_the_fetch_behind_compute():
    """MFS serves the fetch of the nearest layer first: only layer 0's fetch (and any layer that
    outruns compute) stalls, far less than FS's all-together wait."""
    _, fs, r2_fs = _reuse_run("fs")
    _, mfs, r2_mfs = _reuse_run("mfs")
    stall_fs, stall_mfs = fs.batches[r2_fs.batch].stall, mfs.batches[r2_mfs.batch].stall
    first = 64 * BLOCK * KV / NIC
    assert stall_mfs >= first * (1 - 1e-9)
    assert stall_mfs < 0.5 * stall_fs
    assert r2_mfs.ttft < r2_fs.ttft


def test_lookahead_one_fetches_each_layer_just_in_time():
    """Each layer's fetch is issued when the layer starts, so every layer waits about one fetch time.

    Not exactly: r1 runs on the holder's rank 0 too, and its P2D shares the holder GPU's NIC with the
    fetch (per-flow fair, 50/50 while both send)."""
    _, res, r2 = _reuse_run(reuse_lookahead=1)
    per_layer = 64 * BLOCK * KV / NIC
    stall = res.batches[r2.batch].stall
    assert MODEL.num_layers * per_layer * (1 - 1e-9) <= stall < 1.2 * MODEL.num_layers * per_layer


@pytest.mark.parametrize("policy", ["fs", "mfs"])
def test_bytes_conserved_per_stage(policy):
    """Every byte a batch issues is delivered by the network, stage by stage, and attributed to a request."""
    sim, res = run(create_config(servers=8, gpus_per_server=4, kv_placement="local-cache"), _workload(), policy)
    delivered = res.stage_bytes_delivered
    attributed = {st: sum(s.bytes.get(st, 0.0) for s in res.states) for st in ("reuse", "collective", "p2d")}
    for stage in ("reuse", "collective", "p2d"):
        assert delivered[stage] > 0
        assert delivered[stage] == pytest.approx(attributed[stage], rel=1e-9)
    # The fetch moves exactly the prefix's KV (GPU to GPU across servers), every layer.
    assert attributed["reuse"] == pytest.approx(64 * BLOCK * KV * MODEL.num_layers, rel=1e-12)
    # P2D moves every request's whole context, every layer.
    total_tokens = sum(s.input_tokens for s in res.states)
    assert attributed["p2d"] == pytest.approx(total_tokens * KV * MODEL.num_layers, rel=1e-12)
    assert not sim.network.live  # nothing left in flight
    assert all(d.queued_tokens == 0 and not any(d.rank_tokens) and d.scheduler.idle() for d in sim.drivers)
