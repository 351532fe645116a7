"""The Arrow paper's vLLM baselines (``vllm``, ``vllm-disagg``): their dispatch, the cluster shape they
take, the TP all-reduce they pay, and small engine runs checked by hand against the step timer."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.integrations.pools import ClusterSnapshot, Pool, PoolInstance, PoolRequest, create_pool_manager
from laxflow.sim.models import get_deployment, get_model
from laxflow.sim.serving.instances.config import InstanceSimConfig
from laxflow.sim.serving.instances.engine import InstanceEngine
from laxflow.sim.serving.instances.pools import create_pool_dispatcher, reshape_config
from laxflow.sim.serving.instances.profile import StepTimer
from laxflow.sim.workload.request import Request

PROFILE = [(n, 1e-4 * n) for n in (1, 512, 1024, 2048, 4096)]


def req(prefill_instance=None):
    return PoolRequest("r", 0.0, 100, 1.0, 0.1, prefill_instance)


def test_vllm_colocated_balances_request_counts_and_decodes_where_it_prefilled():
    m = create_pool_manager("vllm", PROFILE, max_running_tokens=1000)
    snap = ClusterSnapshot((PoolInstance("a", Pool.PREFILL, queued_prefill_tokens=(10,), decoding=2),
                            PoolInstance("b", Pool.PREFILL, queued_prefill_tokens=(4000, 4000)),
                            PoolInstance("c", Pool.PREFILL, decoding=3)))
    # a: 1 + 2 = 3, b: 2, c: 3 outstanding -> b (request counts, not tokens)
    assert m.dispatch_prefill(req(), snap, 0.0).instance == "b"
    assert m.dispatch_decode(req("c"), snap, 0.0).instance == "c" and m.dispatch_decode(req("c"), snap, 0).moves == ()
    with pytest.raises(ValueError, match="no prefill instance"):
        m.dispatch_decode(req(), snap, 0.0)
    d = create_pool_manager("vllm-disagg", PROFILE, max_running_tokens=1000)
    snap = ClusterSnapshot((PoolInstance("p", Pool.PREFILL), PoolInstance("d", Pool.DECODE, running_tokens=10**6)))
    # Static 1P1D: always the one prefill and the one decode instance, never a flip.
    assert d.dispatch_prefill(req(), snap, 0.0).instance == "p"
    assert d.dispatch_decode(req("p"), snap, 0.0).instance == "d"
    assert d.rebalance(snap, 0.0, 0.1) == ()


def test_reshape_gives_the_papers_shapes_and_rejects_others():
    base = "llama3-8b-tp1-a800"
    v = reshape_config(InstanceSimConfig(instances=8, pools="vllm"))
    dep = get_deployment(v.deployment)
    assert (v.instances, v.prefill_instances, dep.tp, dep.gpus, dep.gpu.name) == (1, None, 8, 8, "a800")
    d = reshape_config(InstanceSimConfig(instances=8, pools="vllm-disagg"))
    assert (d.instances, d.prefill_instances, get_deployment(d.deployment).tp) == (2, 1, 4)
    d = reshape_config(InstanceSimConfig(instances=4, prefill_instances=2, pools="vllm-disagg"))
    assert (d.instances, d.prefill_instances, get_deployment(d.deployment).tp) == (2, 1, 2)
    same = InstanceSimConfig(instances=8, prefill_instances=4, pools="arrow")
    assert reshape_config(same) is same and reshape_config(InstanceSimConfig(instances=8)).deployment == base
    for config, message in (
            (InstanceSimConfig(instances=8, prefill_instances=4, pools="vllm"), "--pools vllm: one colocated instance"),
            (InstanceSimConfig(instances=8, prefill_instances=3, pools="vllm-disagg"),
             "N even \\(or P:D with P = D\\)"),
            (InstanceSimConfig(instances=6, pools="vllm-disagg"), "TP dividing the model's 8 KV heads"),
            (InstanceSimConfig(instances=16, pools="vllm"), "needs 16 GPUs in one node \\(8\\)")):
        with pytest.raises(UserError, match=message):
            reshape_config(config)


def test_tp_all_reduce_is_the_ring_bandwidth_term_by_hand():
    one = StepTimer("llama3-8b-tp1-a800")
    assert one.tp_allreduce_seconds(512) == 0.0
    tp8 = StepTimer(reshape_config(InstanceSimConfig(instances=8, pools="vllm")).deployment)
    # 512 tokens x 4096 hidden x 2 bytes = 4,194,304 B; two all-reduces of 2 x 7/8 of it at 200 GB/s.
    assert tp8.tp_allreduce_seconds(512) == pytest.approx(2 * 1.75 * 4_194_304 / 200e9)
    model = get_model("llama3-8b")
    alone = tp8.seconds([(512, 0)]) - model.num_layers * tp8.tp_allreduce_seconds(512)
    assert 0 < alone < one.seconds([(512, 0)])  # the wide replica is faster, all-reduces included


def _engine(pools: str, instances: int, split: int | None, reqs: list[Request]):
    config = reshape_config(InstanceSimConfig(instances=instances, prefill_instances=split, pools=pools,
                                              ttft_slo=3.0, tpot_slo=0.1))
    dispatcher = create_pool_dispatcher(pools, config)
    engine = InstanceEngine(config, reqs, dispatcher=dispatcher)
    return engine, dispatcher, engine.run()


def test_vllm_runs_one_tp8_instance_whose_ttft_is_its_chunks_by_hand():
    engine, dispatcher, result = _engine("vllm", 8, None, [Request("r0", 0.0, 1024, 3)])
    assert list(engine.instances) == ["i0"] and engine.instances["i0"].role == "colocated"
    s = result.seqs[0]
    t = engine.timer  # the TP8 replica's timer; Sarathi's 512-token chunks, then decode steps there
    first = t.seconds([(512, 0)]) + t.seconds([(512, 512)])
    assert s.token_times[0] == pytest.approx(first)
    assert s.token_times[1] - s.token_times[0] == pytest.approx(t.seconds([(1, 1024)]))
    assert s.decode_instance is None and engine.p2d_bytes == 0.0
    assert dispatcher.result_keys() == {"flips_p2d": 0, "flips_d2p": 0, "pools_end": "1 colocated"}


def test_vllm_disagg_prefills_on_tp4_and_moves_every_kv_to_the_decode_tp4():
    reqs = [Request(f"r{i}", 0.5 * i, 700, 2) for i in range(3)]
    engine, dispatcher, result = _engine("vllm-disagg", 8, None, reqs)
    assert [i.role for i in engine.instances.values()] == ["prefill", "decode"]
    assert get_deployment(engine.config.deployment).tp == 4
    t = engine.timer
    for s in result.seqs:
        assert (s.prefill_instance, s.decode_instance) == ("i0", "i1")
        assert s.prefill_end - s.arrival == pytest.approx(t.seconds([(512, 0)]) + t.seconds([(188, 512)]))
        assert s.token_times[0] == s.kv_landed > s.prefill_end  # seen when its KV has landed
    assert engine.p2d_bytes == pytest.approx(3 * 700 * t.kv_bytes_per_token())
    assert dispatcher.result_keys() == {"flips_p2d": 0, "flips_d2p": 0, "pools_end": "1:1"}
