"""Arrow's elastic pools (Algorithms 1-4, transitions, monitor) and the static baselines, hand-checked."""

from __future__ import annotations

import pytest

from laxflow.integrations.pools import (
    ClusterSnapshot,
    Pool,
    PoolInstance,
    PoolMove,
    PoolRequest,
    TokenIntervalMonitor,
    apply_moves,
    create_pool_manager,
    flip_to_decode,
    flip_to_prefill,
    pool_manager_names,
    settle,
)
from laxflow.integrations.pools.arrow import ArrowConfig

# Profiled TTFT: 10 ms + 0.1 ms/token + 1e-8 s/token^2 -> 1000 tokens: 0.12 s, 2000 tokens: 0.25 s.
PROFILE = [(n, 0.01 + 1e-4 * n + 1e-8 * n * n) for n in (128, 512, 1024, 2048, 4096, 8192)]
MAX_TOKENS = 8000


def arrow():
    return create_pool_manager("arrow", PROFILE, max_running_tokens=MAX_TOKENS)


def cluster(interval: float = 0.05) -> ClusterSnapshot:
    return ClusterSnapshot((
        PoolInstance("p1", Pool.PREFILL, queued_prefill_tokens=(1000, 1000), prefill_elapsed=0.02),  # delay 0.22
        PoolInstance("p2", Pool.PREFILL, queued_prefill_tokens=(2000,)),  # delay 0.25
        PoolInstance("d1", Pool.DECODE, running_tokens=1000, decoding=2, avg_token_interval=interval),
        PoolInstance("d2", Pool.DECODE, running_tokens=3000, decoding=5, avg_token_interval=interval),
    ))


def req(ttft: float, prompt: int = 1000, prefill_instance: str | None = None) -> PoolRequest:
    return PoolRequest("r", 0.0, prompt, ttft, 0.1, prefill_instance)


def test_transition_rules():
    snap = cluster()
    assert flip_to_decode(snap.get("p1")) == PoolMove("p1", Pool.PREFILL, Pool.P_TO_D)  # still prefilling
    assert flip_to_prefill(snap.get("d1")) == PoolMove("d1", Pool.DECODE, Pool.D_TO_P)  # still decoding
    assert flip_to_decode(PoolInstance("x", Pool.PREFILL)) == PoolMove("x", Pool.PREFILL, Pool.DECODE)
    assert flip_to_prefill(PoolInstance("y", Pool.P_TO_D, queued_prefill_tokens=(5,))).dst is Pool.PREFILL
    assert flip_to_decode(PoolInstance("z", Pool.D_TO_P, decoding=1)).dst is Pool.DECODE
    done = ClusterSnapshot((PoolInstance("a", Pool.P_TO_D), PoolInstance("b", Pool.D_TO_P),
                            PoolInstance("c", Pool.P_TO_D, queued_prefill_tokens=(9,))))
    assert settle(done) == [PoolMove("a", Pool.P_TO_D, Pool.DECODE), PoolMove("b", Pool.D_TO_P, Pool.PREFILL)]
    with pytest.raises(ValueError, match="not a prefill pool"):
        flip_to_decode(snap.get("d1"))
    with pytest.raises(ValueError, match="it is in"):
        apply_moves(snap, [PoolMove("d1", Pool.PREFILL, Pool.DECODE)])


def test_prefill_dispatch_algorithm1():
    a, snap = arrow(), cluster()
    assert a.prefill_delay(snap.get("p1")) == pytest.approx(0.22)
    assert a.dispatch_prefill(req(0.5), snap, 0.0).instance == "p1"  # 0.22 + 0.12 <= 0.5
    # 0.34 > 0.3 on p1, no D->P instance, decode load low (mean 2000 < 4000 tokens, intervals
    # under TPOT): Algorithm 3 flips d1 (fewest running tokens) to D->P; it still decodes.
    d = a.dispatch_prefill(req(0.3), snap, 0.0)
    assert d.instance == "d1" and d.moves == (PoolMove("d1", Pool.DECODE, Pool.D_TO_P),)
    after = apply_moves(snap, d.moves)
    assert a.dispatch_prefill(req(0.3), after, 0.0).instance == "d1"  # now the D->P choice, no new flip
    # Elapsed time since arrival counts against the TTFT threshold.
    assert a.dispatch_prefill(PoolRequest("r", -0.2, 1000, 0.5, 0.1), snap, 0.0).moves != ()


def test_overload_rule_keeps_decode_instances():
    a = arrow()
    slow = cluster(interval=0.2)  # decode instances over the 0.1 s TPOT: decode load is not low
    d = a.dispatch_prefill(req(0.3), slow, 0.0)
    assert d.instance == "p1" and d.moves == ()  # fall back to t1, no flip
    one_decoder = ClusterSnapshot(cluster().instances[:3])
    assert a.dispatch_prefill(req(0.3), one_decoder, 0.0).moves == ()  # never the last decode instance


def test_decode_dispatch_algorithm2():
    a, snap = arrow(), cluster()
    assert a.dispatch_decode(req(1.0, prefill_instance="p1"), snap, 0.0).instance == "d1"
    p2d = apply_moves(snap, [PoolMove("p1", Pool.PREFILL, Pool.P_TO_D)])
    assert a.dispatch_decode(req(1.0, prefill_instance="p1"), p2d, 0.0).instance == "p1"  # keeps its KV
    full = ClusterSnapshot((*snap.instances[:2],
                            PoolInstance("d1", Pool.DECODE, running_tokens=9000, decoding=9),
                            PoolInstance("d2", Pool.DECODE, running_tokens=8500, decoding=9)))
    # Both over max running tokens, no P->D: Algorithm 4 flips p1 (least prefill delay), no load check.
    d = a.dispatch_decode(req(1.0, prefill_instance="p2"), full, 0.0)
    assert d.instance == "p1" and d.moves == (PoolMove("p1", Pool.PREFILL, Pool.P_TO_D),)
    last_prefill = ClusterSnapshot(full.instances[1:])
    assert a.dispatch_decode(req(1.0), last_prefill, 0.0).instance == "d2"  # no flip left: least loaded


def test_rebalance_settles_and_flips_on_monitored_load():
    a = arrow()
    calm = ClusterSnapshot((PoolInstance("p1", Pool.PREFILL, queued_prefill_tokens=(100,)),
                            PoolInstance("p2", Pool.P_TO_D),
                            PoolInstance("d1", Pool.DECODE, running_tokens=100, decoding=1, avg_token_interval=0.05)))
    assert a.rebalance(calm, 0.0, 0.1) == (PoolMove("p2", Pool.P_TO_D, Pool.DECODE),)
    slow = ClusterSnapshot((PoolInstance("p1", Pool.PREFILL, queued_prefill_tokens=(100,)),
                            PoolInstance("p2", Pool.PREFILL, queued_prefill_tokens=(4000,)),
                            PoolInstance("d1", Pool.DECODE, running_tokens=100, decoding=1, avg_token_interval=0.3)))
    assert a.rebalance(slow, 0.0, 0.1) == (PoolMove("p1", Pool.PREFILL, Pool.P_TO_D),)  # Algorithm 4
    busy = ClusterSnapshot((PoolInstance("p1", Pool.PREFILL, queued_prefill_tokens=(100,)),
                            PoolInstance("p2", Pool.PREFILL),
                            PoolInstance("d1", Pool.DECODE, running_tokens=7000, decoding=30, avg_token_interval=0.05)))
    assert a.rebalance(busy, 0.0, 0.1) == (PoolMove("p2", Pool.PREFILL, Pool.DECODE),)  # the idle one


def test_static_baselines_never_move():
    snap = cluster()
    static = create_pool_manager("static-pd", PROFILE, max_running_tokens=MAX_TOKENS)
    assert static.dispatch_prefill(req(0.3), snap, 0.0).instance == "p1"
    assert static.dispatch_prefill(req(0.3), snap, 0.0).moves == ()
    assert static.dispatch_decode(req(1.0), snap, 0.0).instance == "d1"
    assert static.rebalance(cluster(interval=1.0), 0.0, 0.1) == ()
    rr = create_pool_manager("round-robin", PROFILE, max_running_tokens=MAX_TOKENS)
    assert [rr.dispatch_prefill(req(1.0), snap, 0.0).instance for _ in range(3)] == ["p1", "p2", "p1"]
    assert [rr.dispatch_decode(req(1.0), snap, 0.0).instance for _ in range(3)] == ["d1", "d2", "d1"]


def test_token_interval_monitor():
    m = TokenIntervalMonitor(window=2)
    for t in (0.0, 0.1, 0.3, 0.4):
        m.record(t)
    assert m.average() == pytest.approx(0.15)  # last two gaps: 0.2 and 0.1
    m.idle()
    m.record(5.0)  # the idle gap is not a slow token
    assert m.average() == pytest.approx(0.15)
    with pytest.raises(ValueError, match="before the previous"):
        m.record(4.0)


def test_bad_configurations_are_rejected():
    assert pool_manager_names() == ["arrow", "round-robin", "static-pd", "vllm", "vllm-disagg"]
    with pytest.raises(ValueError, match="unknown pool manager 'elastic'.*arrow, round-robin, static-pd"):
        create_pool_manager("elastic", PROFILE)
    with pytest.raises(ValueError, match="ArrowConfig.max_running_tokens: must be an integer >= 1"):
        create_pool_manager("arrow", PROFILE)
    with pytest.raises(ValueError, match="ArrowConfig.low_decode_load"):
        ArrowConfig(max_running_tokens=10, low_decode_load=2.0)
    with pytest.raises(ValueError, match="ArrowConfig: unknown option 'ratio'"):
        create_pool_manager("static-pd", PROFILE, max_running_tokens=10, ratio=0.5)
    with pytest.raises(ValueError, match="duplicate instance ids"):
        ClusterSnapshot((PoolInstance("a", Pool.PREFILL), PoolInstance("a", Pool.DECODE)))
    with pytest.raises(ValueError, match="pool must be one of P, D, P->D, D->P"):
        PoolInstance("a", "prefill")
    with pytest.raises(ValueError, match="no instance in pool P"):
        create_pool_manager("static-pd", PROFILE, max_running_tokens=10).dispatch_prefill(
            req(1.0), ClusterSnapshot((PoolInstance("d", Pool.DECODE),)), 0.0)


def test_rebalance_averages_only_decoding_instances():
    # A freshly flipped, still idle decode instance (interval 0) must not hide a slow one (0.3 s).
    a = arrow()
    snap = ClusterSnapshot((PoolInstance("p1", Pool.PREFILL, queued_prefill_tokens=(100,)),
                            PoolInstance("p2", Pool.PREFILL, queued_prefill_tokens=(4000,)),
                            PoolInstance("d1", Pool.DECODE, running_tokens=100, decoding=1, avg_token_interval=0.3),
                            PoolInstance("d2", Pool.DECODE), PoolInstance("d3", Pool.DECODE)))
    assert a.rebalance(snap, 0.0, 0.1) == (PoolMove("p1", Pool.PREFILL, Pool.P_TO_D),)
