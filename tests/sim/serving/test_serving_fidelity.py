"""The serving model's faithfulness to the MFS paper: KV pool and victim units, per-flow fairness,
fixed SLOs, CCT inflation, config validation."""

from __future__ import annotations

import numpy as np
import pytest
from serving_factories import BLOCK, create_config, create_request, run

from laxflow.errors import UserError
from laxflow.policy.fair_sharing import FairSharing
from laxflow.policy.flow import Flow, Stage
from laxflow.sim.events import EventQueue
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.metrics import summarize
from laxflow.sim.serving.router import GlobalRouter, PrefixCaches

PREFIX = tuple(range(5000, 5064))  # 64 blocks = 1024 tokens


def _hot_prefix_workload(r3_arrival: float):
    """r0 computes PREFIX on unit 0; r1 keeps unit 0 busy; r2 and later r3 share PREFIX and run on unit 1."""
    return [
        create_request(0, 0.0, 64 * BLOCK, PREFIX),
        create_request(1, 1.0, 8000),
        create_request(2, 1.0, 74 * BLOCK, PREFIX),
        create_request(3, r3_arrival, 70 * BLOCK, PREFIX, salt=3),
    ]


def _r3_while_r1_runs() -> float:
    """An instant after r2 is done on unit 1 and before r1 leaves unit 0 (taken from a run without r3)."""
    _, res = run(create_config(servers=4, kv_placement="pool"), _hot_prefix_workload(1.0)[:3])
    r1, r2 = res.states[1], res.states[2]
    assert r2.compute_end < r1.compute_end
    return (r2.compute_end + r1.compute_end) / 2


def test_pool_keeps_the_hot_prefix_on_its_victim_unit():
    """With ``pool`` unit 1 fetches PREFIX from unit 0 every time; with ``local-cache`` it keeps a copy."""
    at = _r3_while_r1_runs()
    _, pool = run(create_config(servers=4, kv_placement="pool"), _hot_prefix_workload(at))
    _, local = run(create_config(servers=4, kv_placement="local-cache"), _hot_prefix_workload(at))
    for res in (pool, local):
        r2 = res.states[2]
        assert (r2.route.prefill, r2.route.fetches) == (1, ((0, 0, 64 * BLOCK),))
        assert res.states[3].route.prefill == 1
    r3_pool, r3_local = pool.states[3].route, local.states[3].route
    assert (r3_pool.local_tokens, r3_pool.fetches) == (0, ((0, 0, 64 * BLOCK),))  # unit 0 is the victim again
    assert (r3_local.local_tokens, r3_local.remote_tokens) == (64 * BLOCK, 0)  # the copy r2 left on unit 1
    assert summarize(pool, 1.0)["remote_reuse_share"] == pytest.approx(1.0)
    assert summarize(local, 1.0)["remote_reuse_share"] == pytest.approx(0.5)
    # Pool: both readers' fetches are stage-1 bytes; local-cache: only r2's.
    reuse_pool = sum(s.bytes.get("reuse", 0.0) for s in pool.states)
    reuse_local = sum(s.bytes.get("reuse", 0.0) for s in local.states)
    assert reuse_pool == pytest.approx(2 * reuse_local)


def test_pool_prefix_split_over_two_owners_is_fetched_from_both():
    """Blocks live where they were first computed: a request reusing a prefix computed partly on each
    of units 0 and 1 fetches each part from its owner (and its rank) when it runs on unit 2."""
    first, second = list(range(7000, 7032)), list(range(8000, 8032))
    caches = PrefixCaches(3, 1 << 20, "pool")
    caches.insert(0, first, BLOCK, rank=3)
    caches.insert(1, first + second, BLOCK, rank=5)  # `first` is already in the pool: not copied
    assert caches.owners(first + second + [1]) == [0] * 32 + [1] * 32
    router = GlobalRouter(3, 1, caches, overlap_weight=1.0)
    # Units 0 and 1 are loaded, so unit 2 wins and fetches from both.
    route = router.route(first + second + [9], BLOCK, 65 * BLOCK, [10_000, 10_000, 0], [0.0])
    assert route.prefill == 2
    assert route.fetches == ((0, 3, 32 * BLOCK), (1, 5, 32 * BLOCK))
    assert (route.local_tokens, route.remote_tokens) == (0, 64 * BLOCK)


def _two_port_network():
    """4 servers x 1 GPU on a big switch at 100 Gbit/s; FS."""
    cluster = Cluster(ClusterConfig(servers=4, gpus_per_server=1, nic_gbps=100.0, nvswitch_gbps=7200.0,
                                    topology="big-switch"), 2)
    queue = EventQueue()
    return cluster, queue, FluidNetwork(cluster.topology, FairSharing(), queue)


def test_fs_is_per_flow_fair_at_a_port_fig_6b():
    """Fig. 6b: one all-to-all flow and one KV flow into the same ingress port share it 50/50.

    The all-to-all of unit (GPU 0, GPU 1) is a group of two point-to-point flows, 0->1 and 1->0; the
    KV flow 2->1 meets 0->1 at GPU 1's ingress. Each is sized to take 1 s alone, so under per-flow
    fairness both take 2 s (the group weighted by its byte share would have given the KV flow 2/3
    and let it finish at 1.5 s).
    """
    cluster, queue, network = _two_port_network()
    cap = cluster.config.nic_bytes_per_s
    unit = cluster.prefill_units[0]
    coll = cluster.collective(unit, "uniform", [[0, 1]])
    kv = cluster.transfer((2,), (1,))
    assert (coll.pairs, kv.pairs) == (2, 1)
    per_gpu = 2 * cap  # each GPU sends half of it to its peer: cap bytes per pair, 1 s alone
    done: dict[str, float] = {}
    for fid, stage, payload, pat in (("a2a", Stage.COLLECTIVE, per_gpu, coll), ("kv", Stage.P2D, cap, kv)):
        net = payload * pat.net_bytes
        flow = Flow(id=fid, size=net / pat.pairs, links=pat.links, weights=pat.weights, stage=stage)
        network.add_flow(flow, lambda f: done.__setitem__(f.id, queue.now))
    queue.run()
    assert done["a2a"] == pytest.approx(2.0, rel=1e-9)
    assert done["kv"] == pytest.approx(2.0, rel=1e-9)


def test_a_wide_collective_gets_one_share_per_flow_at_a_shared_nic():
    """A 4-GPU all-to-all (GPU 0 sends to 3 peers) and one P2D flow out of GPU 0's NIC: 3 of 4 shares."""
    cluster = Cluster(ClusterConfig(servers=8, gpus_per_server=1, nic_gbps=100.0, nvswitch_gbps=7200.0,
                                    topology="big-switch"), 4)
    coll = cluster.collective(cluster.prefill_units[0], "uniform", [[0, 1, 2, 3]])
    kv = cluster.transfer((0,), (5,))
    nic0_out = int(np.intersect1d(coll.links, kv.links)[0])
    w_coll = coll.weights[list(coll.links).index(nic0_out)]
    w_kv = kv.weights[list(kv.links).index(nic0_out)]
    assert (w_coll, w_kv) == pytest.approx((3.0, 1.0))  # flows crossing the link, per unit of per-flow rate


def test_slo_is_fixed_by_the_workload_not_by_the_policy_or_the_route():
    """Every policy sees the same SLO per request, and it does not depend on where the request ran."""
    reqs = _hot_prefix_workload(2.0)
    slos = {}
    for policy in ("fs", "sjf", "mfs"):
        _, res = run(create_config(servers=4), reqs, policy)
        slos[policy] = [s.slo for s in res.states]
    assert slos["fs"] == slos["sjf"] == slos["mfs"]
    # r2 (remote fetch) and a request of its shape reusing locally get the same SLO.
    sim, res = run(create_config(servers=4), reqs)
    r2 = res.states[2]
    assert r2.route.remote_tokens > 0
    assert r2.idle_ttft == pytest.approx(sim.slo.idle_ttft(r2.input_tokens, 64 * BLOCK))
    assert r2.slo == pytest.approx(3 * r2.idle_ttft)


def test_cct_inflation_is_one_alone_and_above_one_under_contention():
    alone = create_config(servers=4, gpus_per_server=4)
    _, res = run(alone, [create_request(0, 0.0, 2000)])
    assert summarize(res, 1.0)["cct_inflation"] == pytest.approx(1.0, rel=1e-9)
    # r1 reuses r0's 30,000-token prefix and computes 64 tokens: each layer's P2D (the whole context)
    # is still leaving the GPU's NIC when the next layer's dispatch starts (intra-request contention).
    prefix = tuple(range(9000, 9000 + 1875))
    reqs = [create_request(0, 0.0, 1875 * BLOCK, prefix), create_request(1, 10.0, 1879 * BLOCK, prefix)]
    _, busy = run(alone, reqs)
    assert busy.states[1].route.local_tokens == 1875 * BLOCK
    assert summarize(busy, 1.0)["cct_inflation"] > 1.01


def test_serving_config_validates_on_construction():
    with pytest.raises(UserError, match="kv_placement"):
        ServingConfig(kv_placement="everywhere")
    with pytest.raises(UserError, match="token_budget"):
        ServingConfig(token_budget=0)
    with pytest.raises(UserError, match="servers"):
        ClusterConfig(servers=1)
    assert ServingConfig().kv_placement == "pool"  # the paper's setting is the default


def test_testbed_allgather_rings_spread_over_every_nic():
    """vLLM's allgather_reducescatter on the testbed: NCCL rings, one per channel, each crossing between
    the two servers at a different GPU, so all 8 NICs carry the same share (not 2 of them everything)."""
    from laxflow.sim.serving.plan import ModelRunner

    runner = ModelRunner("mixtral-8x7b", "testbed-mixtral-8x7b")
    cluster = Cluster(ClusterConfig(servers=8, gpus_per_server=4, nic_gbps=50.0, nvswitch_gbps=126.0,
                                    topology="testbed"), runner.unit_gpus)
    plan = runner.plan(cluster, cluster.prefill_units[0], [1000] * 8, [1000] * 8, list(range(8)))
    dispatch = next(s for s in plan.segments if s.name == "ep-dispatch")
    assert dispatch.pattern.pairs == 8  # 4 rings x 2 crossing hops
    share = dispatch.pattern.weights / dispatch.pattern.pairs  # share of the group's network bytes per link
    assert share.max() == pytest.approx(1 / 8)  # one ring would put 1/2 on each of two NICs
