"""Routers pab, dplb (FairBatching §3.4) and gorouting, minload (ProServe Algorithm 2), hand-checked."""

from __future__ import annotations

import pytest

from laxflow.integrations.prefill import SequenceView
from laxflow.integrations.prefill.latency import ProServeLatencyModel
from laxflow.integrations.routing import InstanceView, QueuedPrefill, create_router, router_names
from laxflow.integrations.routing.gorouting import GoRouting, GoRoutingConfig
from laxflow.integrations.routing.minload import MinLoad

# 1 ms per prefill token, 10 ms per batch, decode 1 ms
MODEL = ProServeLatencyModel(a_p=0.0, b_p=0.0, c_p=0.001, a_d=0.0, b_d=0.001, t_c=0.01)


def request(rid: str = "r", prompt: int = 300, ttft: float = 1.0, weight: float = 1.0) -> SequenceView:
    return SequenceView(rid, 0.0, ttft, 0.1, prompt_tokens=prompt, weight=weight)


def queued(rid: str, tokens: int, deadline: float = 1.0) -> QueuedPrefill:
    return QueuedPrefill(rid, tokens, deadline)


def test_dplb_scores_and_optimistic_count():
    router = create_router("dplb")
    views = [InstanceView("a", waiting=1, running=0, reported_at=0.0),  # score 4
             InstanceView("b", waiting=0, running=3, reported_at=0.0)]  # score 3
    assert router.route(request(), views, 0.0).prefill == "b"
    assert router.route(request(), views, 0.0).prefill == "a"  # b now counts 4*1 + 3 = 7 > 4
    # A newer report replaces the router's own count.
    fresh = [InstanceView("a", waiting=5, reported_at=1.0), InstanceView("b", running=3, reported_at=1.0)]
    assert router.route(request(), fresh, 1.0).prefill == "b"


def test_pab_spends_its_local_view_until_the_next_report():
    router = create_router("pab")
    views = [InstanceView("a", pab=1000, reported_at=0.0), InstanceView("b", pab=600, reported_at=0.0)]
    picks = [router.route(request(prompt=500), views, 0.0).prefill for _ in range(3)]
    assert picks == ["a", "b", "a"]  # budgets 1000/600 -> 500/600 -> 500/100
    report = [InstanceView("a", pab=0, reported_at=1.0), InstanceView("b", pab=50, reported_at=1.0)]
    assert router.route(request(prompt=500), report, 1.0).prefill == "b"  # over budget everywhere: least over


def test_gorouting_reserves_the_lighter_instance():
    router = GoRouting(MODEL)
    views = [InstanceView("a", prefill_queue=(queued("a1", 350),)),  # drains in 0.36 s
             InstanceView("b", prefill_queue=(queued("b1", 800),)),  # 0.81 s: the request would be late
             InstanceView("c", prefill_queue=(queued("c1", 400),))]  # 0.41 s
    g = router
    assert g.estimate_exec(views[0], 0.0) == pytest.approx(0.36)
    # Delta: a +1, b 0 (the request would finish at 1.12 s), c +1 -> candidates a, c; none light
    # (both over mu * TTFT = 0.3), none heavy (0.67 and 0.72 under lam * TTFT = 0.8):
    # the busiest candidate, c, keeps a free for a later long request.
    assert router.route(request(), views, 0.0).prefill == "c"
    assert MinLoad(MODEL).route(request(), views, 0.0).prefill == "a"
    light = [InstanceView("a"), views[2]]
    assert router.route(request(), light, 0.0).prefill == "a"  # a light instance exists: the idlest
    all_heavy = GoRouting(MODEL, GoRoutingConfig(mu=0.1, lam=0.5))
    assert all_heavy.route(request(), views, 0.0).prefill == "a"  # every candidate heavy: least loaded


def test_gorouting_gain_uses_priority_and_queue_lag():
    g = GoRouting(MODEL)
    v = InstanceView("a", prefill_queue=(QueuedPrefill("x", 900, 1.0, weight=2.0),), queue_updated_at=-0.5)
    # the head ran 0.5 s since the report: 0.41 s left, so a 300-token request still makes it
    assert g.estimate_exec(v, 0.0) == pytest.approx(0.41)
    assert g.estimate_gain(v, v.prefill_queue, 0.0, 0.1) == pytest.approx(2.0)
    post = g.estimate_gain(v, v.prefill_queue + (QueuedPrefill("r", 300, 1.0),), 0.0, 0.1)
    assert post == pytest.approx(3.0)


def test_gorouting_no_gain_falls_back_to_a_seeded_random_instance():
    views = [InstanceView("a"), InstanceView("b"), InstanceView("c")]
    impossible = request(prompt=5000)  # 5 s of prefill against a 1 s TTFT
    picks = [GoRouting(MODEL, GoRoutingConfig(seed=7)).route(impossible, views, 0.0).prefill for _ in range(2)]
    assert picks[0] == picks[1] and picks[0] in {"a", "b", "c"}


def test_colocated_counts_decodes_and_decode_pick_by_free_blocks():
    g = GoRouting(MODEL, GoRoutingConfig(setting="colocated"))
    v = InstanceView("a", prefill_queue=(queued("a1", 100),), decoding=20)
    assert g.estimate_exec(v, 0.0) == pytest.approx(0.1 + 20 * 0.001)  # no per-batch t_c colocated
    decoders = [InstanceView("d1", free_kv_blocks=10), InstanceView("d2", free_kv_blocks=40)]
    assert g.route(request(), [v], 0.0, decoders).decode == "d2"
    tied = [InstanceView("d9", free_kv_blocks=40), InstanceView("d3", free_kv_blocks=40, decoding=1),
            InstanceView("d5", free_kv_blocks=40)]
    assert g.route(request(), [v], 0.0, tied).decode == "d5"  # fewer decodes, then lowest id
    assert create_router("dplb").route(request(), [v], 0.0).decode is None


def test_bad_configurations_are_rejected():
    assert router_names() == ["dplb", "gorouting", "minload", "pab"]
    with pytest.raises(ValueError, match="unknown router 'rr'.*gorouting"):
        create_router("rr")
    with pytest.raises(ValueError, match="GoRoutingConfig.setting: 'both' is not one of colocated, disaggregated"):
        GoRoutingConfig(setting="both")
    with pytest.raises(ValueError, match="GoRoutingConfig.mu: must be <= lam"):
        GoRoutingConfig(mu=0.9, lam=0.5)
    with pytest.raises(ValueError, match="GoRoutingConfig.alpha"):
        GoRoutingConfig(alpha=1.5)
    with pytest.raises(ValueError, match="PabConfig: unknown option .alpha. \\(it takes no options\\)"):
        create_router("pab", alpha=0.5)
    with pytest.raises(ValueError, match="router pab: no instance"):
        create_router("pab").route(request(), [], 0.0)
