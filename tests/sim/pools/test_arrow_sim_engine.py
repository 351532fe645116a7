"""Pool managers on the real iteration-level engine (llama3-8b on one A800 per instance, compute model).

Small hand-sized clusters: a prefill burst that only more prefill instances
can absorb, a decode limit that forces prefill instances into decode, and
the pool invariants (never fewer than one prefill- and one decode-capable
instance; every instance's role matches its pool at the end).
"""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.integrations.pools import Pool
from laxflow.sim.serving.instances.config import InstanceSimConfig
from laxflow.sim.serving.instances.engine import InstanceEngine
from laxflow.sim.serving.instances.metrics import summarize
from laxflow.sim.serving.instances.pools import LazyPoolDispatcher, create_pool_dispatcher
from laxflow.sim.serving.pools_driver import POOL_OF_ROLE, ROLE_OF
from laxflow.sim.workload.request import Request


def run(pools: str, requests: list[Request], split: int = 2, n: int = 4, options: dict | None = None):
    config = InstanceSimConfig(instances=n, prefill_instances=split, pools=pools, ttft_slo=1.0, tpot_slo=0.1)
    dispatcher = LazyPoolDispatcher(pools, split, options)
    engine = InstanceEngine(config, requests, dispatcher=dispatcher)
    result = engine.run()
    return engine, dispatcher.driver, result


def burst(k: int = 24, prompt: int = 4096, outputs: int = 4) -> list[Request]:
    return [Request(f"r{i}", 0.001 * i, prompt, outputs) for i in range(k)]


def check_invariants(engine, driver, split: int) -> None:
    pools = {iid: (Pool.PREFILL if k < split else Pool.DECODE) for k, iid in enumerate(engine.instances)}
    for _, move in driver.table.flips:  # replay: never without a prefill- or decode-capable instance
        assert pools[move.instance] is move.src
        pools[move.instance] = move.dst
        assert sum(p in (Pool.PREFILL, Pool.D_TO_P) for p in pools.values()) >= 1
        assert sum(p in (Pool.DECODE, Pool.P_TO_D) for p in pools.values()) >= 1
    assert pools == driver.table.pools
    for iid, inst in engine.instances.items():
        assert inst.role == ROLE_OF[pools[iid]] and not inst.seqs and not inst.outbound


def test_arrow_flips_decode_instances_into_a_prefill_burst():
    reqs = burst()
    engine, arrow, result = run("arrow", reqs)
    _, static, static_result = run("static-pd", reqs)
    assert all(s.done and len(s.token_times) == 4 for s in result.seqs)
    kinds = arrow.stats()["pool_flip_kinds"]
    # 24 x 4096 tokens (~0.33 s each alone) against a 1 s TTFT on 2 prefill instances: Algorithm 3
    # takes a decode instance (idle: D -> P at once), never the last one.
    assert kinds.get("D>P", 0) + kinds.get("D>D->P", 0) >= 1
    check_invariants(engine, arrow, 2)
    assert static.table.flips == []
    assert all(s.decode_instance in ("i2", "i3") for s in static_result.seqs)
    a = summarize(result, 1.0, {"policy": "fs", "pools": "arrow"})
    b = summarize(static_result, 1.0, {"policy": "fs", "pools": "static-pd"})
    assert a["ttft_attainment"] > b["ttft_attainment"] and a["ttft_p90"] < b["ttft_p90"]


def test_decode_limit_flips_prefill_instances_and_keeps_kv_local():
    # Max Running Tokens 1: a decode instance already decoding never fits, so Algorithm 2 keeps
    # flipping prefill instances (Algorithm 4, no load check) until one prefill instance is left.
    reqs = [Request(f"r{i}", 0.5 * i, 512, 200) for i in range(8)]
    engine, arrow, result = run("arrow", reqs, split=3, n=4, options={"max_running_tokens": 1})
    assert all(s.done for s in result.seqs)
    kinds = arrow.stats()["pool_flip_kinds"]
    assert kinds.get("P>D", 0) + kinds.get("P>P->D", 0) >= 1
    check_invariants(engine, arrow, 3)
    # A request whose prefill instance was flipped to decode before its prompt finished decoded
    # there: its tokens all came from one instance and no KV left it.
    local = [s for s in result.seqs if s.decode_instance is None]
    moved = [s for s in result.seqs if s.decode_instance not in (None, s.prefill_instance)]
    assert local and len(local) + len(moved) == len(reqs)
    assert all(s.prefill_instance in ("i0", "i1") for s in local)  # the flipped ones
    assert result.extra == {} and engine.p2d_bytes == pytest.approx(
        sum(s.prompt for s in moved) * engine.timer.kv_bytes_per_token())


def test_round_robin_cycles_and_pool_errors():
    reqs = [Request(f"r{i}", 0.2 * i, 256, 2) for i in range(6)]
    engine, rr, result = run("round-robin", reqs)
    assert [s.prefill_instance for s in result.seqs] == ["i0", "i1"] * 3
    assert [s.decode_instance for s in result.seqs] == ["i2", "i3"] * 3
    assert POOL_OF_ROLE == {"prefill": Pool.PREFILL, "decode": Pool.DECODE}
    with pytest.raises(UserError, match="--pools arrow: needs at least 2 instances"):
        create_pool_dispatcher("arrow", InstanceSimConfig(instances=1))
    with pytest.raises(UserError, match="--pools: unknown 'elastic'"):
        create_pool_dispatcher("elastic", InstanceSimConfig(instances=4))
    # --instances N (colocated): the pools start half and half.
    config = InstanceSimConfig(instances=4, pools="static-pd", ttft_slo=1.0, tpot_slo=0.1)
    engine = InstanceEngine(config, reqs, dispatcher=create_pool_dispatcher("static-pd", config))
    engine.run()
    assert [i.role for i in engine.instances.values()] == ["prefill", "prefill", "decode", "decode"]
