"""The iteration-level engine on small hand-checked cases: step times, decode, KV preemption, P2D, routers."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.sim.models import get_deployment, get_model, layer_compute_time
from laxflow.sim.models.spec import weight_bytes_per_gpu
from laxflow.sim.serving.instances import InstanceEngine, InstanceSimConfig
from laxflow.sim.serving.instances.instance import Instance, Seq
from laxflow.sim.serving.instances.metrics import request_metrics, summarize
from laxflow.sim.serving.instances.profile import StepTimer
from laxflow.sim.workload.request import Request

DEP = "llama3-8b-tp1-a800"


def _cfg(**kw) -> InstanceSimConfig:
    base = dict(deployment=DEP, instances=1, scheduler="sarathi", router="dplb", ttft_slo=1.0, tpot_slo=0.1)
    return InstanceSimConfig(**{**base, **kw})


def _req(i: int, arrival: float, prompt: int, outputs: int, category: str | None = None) -> Request:
    return Request(id=f"r{i}", arrival=arrival, input_tokens=prompt, output_tokens=outputs, category=category)


def test_decode_step_is_memory_bound_on_weights():
    timer = StepTimer(DEP)
    dep, model = get_deployment(DEP), get_model("llama3-8b")
    one = timer.seconds([(1, 100)])
    assert one == pytest.approx(model.num_layers * layer_compute_time(model, dep, [1], [101]))
    # One decode token reads every weight once: ~ weight bytes over effective HBM bandwidth.
    floor = weight_bytes_per_gpu(model, dep) / (dep.gpu.mem_bw * dep.gpu.mbu)
    assert 0.7 * floor < one < 1.3 * floor
    # 64 decodes share the weight read: far less than 64 single steps, more than one.
    many = timer.seconds([(1, 100)] * 64)
    assert one < many < 8 * one
    # Longer contexts read more KV.
    assert timer.seconds([(1, 8000)] * 64) > many


def test_lone_request_token_times_follow_the_compute_model():
    eng = InstanceEngine(_cfg(), [_req(0, 0.0, 300, 4)])
    res = eng.run()
    s = res.seqs[0]
    t = StepTimer(DEP)
    expect = [t.seconds([(300, 0)])]
    for j in range(1, 4):  # decode j feeds back output j-1: context 300 + j - 1
        expect.append(expect[-1] + t.seconds([(1, 300 + j - 1)]))
    assert s.token_times == pytest.approx(expect)
    m = request_metrics(s)
    assert m["ttft"] == pytest.approx(expect[0])
    assert m["tpot"] == pytest.approx((expect[-1] - expect[0]) / 3)


def test_sarathi_chunks_a_long_prompt_and_mixes_decodes():
    eng = InstanceEngine(_cfg(), [_req(0, 0.0, 100, 50), _req(1, 0.05, 1200, 2)])
    inst = eng.instances["i0"]
    seen = []
    real = inst.begin_step

    def spy(now):
        secs = real(now)
        if inst.batch is not None:
            seen.append([(e.id, e.new_tokens, e.is_prefill) for e in inst.batch.entries])
        return secs

    inst.begin_step = spy
    eng.run()
    mixed = [b for b in seen if ("r0", 1, False) in b and any(e[0] == "r1" for e in b)]
    # r1's 1200-token prompt runs in 511-, 512- and 177-token chunks beside r0's decode (budget 512).
    assert [e[1] for b in mixed for e in b if e[0] == "r1"][:3] == [511, 511, 178]


def test_kv_limit_preempts_the_newest_and_recomputes_it():
    # Two 100-token prompts, 60 outputs each, 220 KV tokens: both cannot finish side by side.
    eng = InstanceEngine(_cfg(kv_tokens=220), [_req(0, 0.0, 100, 60), _req(1, 0.001, 100, 60)])
    inst = eng.instances["i0"]
    peak = []
    real = inst.end_step

    def spy(now):
        out = real(now)
        peak.append(inst.kv_used())
        return out

    inst.end_step = spy
    res = eng.run()
    a, b = res.seqs
    assert a.preemptions == 0 and b.preemptions >= 1  # vLLM: the most recently arrived one goes
    assert max(peak) <= 220
    for s in (a, b):
        assert len(s.token_times) == 60 and all(x < y for x, y in zip(s.token_times, s.token_times[1:]))
    assert b.folded > 0  # it prefilled again over prompt + the outputs it had


def test_request_larger_than_kv_is_one_error():
    with pytest.raises(UserError, match="exceed one instance's KV memory"):
        InstanceEngine(_cfg(kv_tokens=100), [_req(0, 0.0, 90, 20)])


def test_metrics_tpot_tdg_and_priorities():
    seqs = [Seq("h", 0.0, 10, 3, 0.5, 0.1, weight=2.0, token_times=[0.4, 0.45, 0.8]),  # 3rd token late (0.7)
            Seq("l", 0.0, 10, 2, 0.5, 0.1, weight=1.0, token_times=[0.6, 0.65])]  # TTFT missed
    m = request_metrics(seqs[0])
    assert m["ttft"] == 0.4 and m["tpot"] == pytest.approx(0.2) and m["max_tbt"] == pytest.approx(0.35)
    from laxflow.sim.serving.instances.engine import InstanceResult

    res = InstanceResult(seqs, seqs, {"i0": {"busy_s": 1.0}}, w_p=2.0, w_d=1.0, p2d_bytes=0.0, wall_s=0.0,
                         sim_time=1.0, network_events=0)
    row = summarize(res, 1.0, {"policy": "fs"})
    # h: tokens 1 and 2 on time: 2*(2+1) = 6 of 2*(2+1+1) = 8; l: token 2 (0.65 < 0.6? no) -> 0 of 3.
    assert row["tdg_gain"] == pytest.approx(6.0)
    assert row["tdg_ratio"] == pytest.approx(6.0 / 11.0)
    assert row["slo_attainment"] == 0.0 and row["ttft_attainment"] == 0.5
    assert row["slo_attainment_high"] == 0.0 and row["tdg_ratio_high"] == pytest.approx(0.75)
    assert row["token_deadline_attainment"] == pytest.approx(2 / 5)


def test_disaggregated_kv_crosses_the_network_before_decode():
    eng = InstanceEngine(_cfg(instances=2, prefill_instances=1), [_req(0, 0.0, 2000, 3)])
    res = eng.run()
    s = res.seqs[0]
    t = StepTimer(DEP)
    kv = 2000 * t.kv_bytes_per_token()
    assert res.p2d_bytes == kv
    port = get_deployment(DEP).nic_gbps * 1e9 / 8
    # Second token: after the KV lands on the decode instance, one decode step there.
    assert s.kv_landed == s.token_times[0] == pytest.approx(s.prefill_end + kv / port, rel=1e-9)
    assert s.token_times[1] == pytest.approx(s.prefill_end + kv / port + t.seconds([(1, 2000)]), rel=1e-6)
    assert s.prefill_instance == "i0" and s.decode_instance == "i1"
    assert res.instances["i1"]["steps"] == 2 and res.instances["i0"]["steps"] == 4  # 2000 tokens in 512 chunks


def test_ideal_network_lands_the_kv_at_once_and_counts_its_bytes():
    runs = {net: InstanceEngine(_cfg(instances=2, prefill_instances=1, network=net), [_req(0, 0.0, 2000, 3)])
            for net in ("fabric", "ideal")}
    res = {net: eng.run() for net, eng in runs.items()}
    kv = 2000 * StepTimer(DEP).kv_bytes_per_token()
    fab, ideal = res["fabric"].seqs[0], res["ideal"].seqs[0]
    assert ideal.prefill_end == fab.prefill_end  # the prefill is the same
    port = get_deployment(DEP).nic_gbps * 1e9 / 8
    assert ideal.token_times[1] == pytest.approx(fab.token_times[1] - kv / port, rel=1e-9)  # no transfer time
    assert res["ideal"].network_events == 0 < res["fabric"].network_events
    for net in ("fabric", "ideal"):
        assert runs[net].fabric.delivered == {"reuse": 0.0, "collective": 0.0, "p2d": kv}
        assert res[net].p2d_bytes == kv and runs[net].p2d_flows == {}


def test_ideal_network_changes_nothing_on_colocated_instances():
    reqs = [_req(i, 0.01 * i, 300 + 50 * i, 4) for i in range(12)]
    times = {net: [s.token_times for s in InstanceEngine(_cfg(instances=2, network=net), reqs).run().seqs]
             for net in ("fabric", "ideal")}
    assert times["fabric"] == times["ideal"]


def test_dplb_spreads_and_pab_avoids_the_loaded_instance():
    reqs = [_req(0, 0.0, 4000, 5), _req(1, 0.0, 100, 5)]
    eng = InstanceEngine(_cfg(instances=2), reqs)
    eng.run()
    assert {s.prefill_instance for s in eng.seqs} == {"i0", "i1"}
    # pab: after i0 reported a step with a long prefill queued, a later short request goes to i1.
    reqs = [_req(0, 0.0, 6000, 5), _req(1, 0.02, 100, 5), _req(2, 0.03, 100, 5)]
    eng = InstanceEngine(_cfg(instances=2, scheduler="fairbatching", router="pab"), reqs)
    eng.run()
    where = {s.id: s.prefill_instance for s in eng.seqs}
    assert where["r1"] != where["r0"] and where["r2"] != where["r0"]


def test_fairbatching_and_slidebatching_run_colocated_and_disaggregated():
    from laxflow.sim.workload import generate

    reqs = generate("qwen-trace", 6.0, 60, 1)
    for sched, router, pre in (("fairbatching", "pab", None), ("slidebatching", "gorouting", None),
                               ("slidebatching", "gorouting", 1), ("edf", "minload", 1)):
        eng = InstanceEngine(_cfg(instances=2, prefill_instances=pre, scheduler=sched, router=router,
                                  ttft_slo=0.5, tpot_slo=0.05), reqs)
        res = eng.run()
        assert all(len(s.token_times) == s.target_outputs for s in res.seqs)
        row = summarize(res, 3.0, {"policy": "fs"})
        assert 0 < row["tdg_ratio"] <= 1 and "slo_attainment_high" in row
        assert res.w_p == pytest.approx(sum(r.input_tokens for r in reqs) / sum(r.output_tokens for r in reqs))


def test_set_role_flips_between_steps_and_rejects_unknown_roles():
    eng = InstanceEngine(_cfg(instances=2, prefill_instances=1), [_req(0, 0.0, 100, 3)])
    eng.set_role("i1", "prefill")
    assert isinstance(eng.instances["i1"], Instance) and eng.instances["i1"].role == "prefill"
    with pytest.raises(ValueError, match="role"):
        eng.set_role("i0", "both")
    res = eng.run()  # no decode instance left: the router's choice falls back to decoding in place
    assert len(res.seqs[0].token_times) == 3


def test_bad_config_is_one_user_error():
    with pytest.raises(UserError, match="--prefill flowprefill: a prefill scheduler runs prefill units"):
        _cfg(scheduler="flowprefill")
    with pytest.raises(UserError, match="--router"):
        _cfg(router="nope")
    with pytest.raises(UserError, match="--instances"):
        _cfg(instances=2, prefill_instances=2)
    with pytest.raises(UserError, match="--network: unknown 'free' \\(expected one of fabric, ideal\\)"):
        _cfg(network="free")
    with pytest.raises(UserError, match="--prefill fairbatching: .*max_token_budget"):
        InstanceEngine(_cfg(scheduler="fairbatching", scheduler_options={"max_token_budget": 0}),
                       [_req(0, 0.0, 10, 2)])


def test_admission_control_rejects_under_overload_and_counts_misses():
    from laxflow.sim.serving.instances import InstanceEngine, InstanceSimConfig
    from laxflow.sim.serving.instances.metrics import summarize
    from laxflow.sim.workload import generate

    reqs = generate("qwen-trace", 30.0, 120, 0)  # far past one instance's capacity
    rows = {}
    for sched in ("fairbatching", "fairbatching-pab"):
        result = InstanceEngine(InstanceSimConfig(scheduler=sched, ttft_slo=0.5, tpot_slo=0.05), reqs).run()
        rows[sched] = summarize(result, 30.0, {"policy": "fs"})
        assert all(s.done for s in result.seqs)
    pab, fb = rows["fairbatching-pab"], rows["fairbatching"]
    assert fb["rejected"] == 0 and 0 < pab["rejected"] < 120 and pab["requests"] == fb["requests"] == 120
    served = 1 - pab["rejected"] / 120
    assert pab["slo_attainment"] <= served + 1e-9 and pab["envelope_attainment"] <= served + 1e-9
    assert pab["ttft_p99"] < fb["ttft_p99"]  # the admitted ones are not queued behind an overload


def test_a_disaggregated_first_token_reaches_the_user_when_its_kv_has_landed():
    # TTFT ends at the last P2D byte, as on the unit engine: the prefill instance's first token rides with the KV.
    reqs = [_req(0, 0.0, 2000, 3)]
    res = {net: InstanceEngine(_cfg(instances=2, prefill_instances=1, network=net), reqs).run().seqs[0]
           for net in ("fabric", "ideal")}
    fab, ideal = res["fabric"], res["ideal"]
    kv = 2000 * StepTimer(DEP).kv_bytes_per_token()
    port = get_deployment(DEP).nic_gbps * 1e9 / 8
    assert fab.prefill_end == ideal.prefill_end == ideal.token_times[0]  # the same prefill; ideal: lands at once
    assert fab.kv_landed == pytest.approx(fab.prefill_end + kv / port, rel=1e-9)
    assert fab.token_times[0] == fab.kv_landed > fab.prefill_end
    assert request_metrics(fab)["ttft"] == fab.kv_landed  # arrival 0
    assert request_metrics(fab)["tpot"] == pytest.approx((fab.token_times[2] - fab.kv_landed) / 2)
    colo = InstanceEngine(_cfg(instances=1), reqs).run().seqs[0]  # nothing moves: TTFT is the emission
    assert colo.kv_landed is None and colo.token_times[0] == colo.prefill_end


def test_a_prompts_kv_flow_belongs_to_the_prefill_step_that_finished_it():
    # The flow policy's batch is the prefill step (as the layered P2D's flows): MFS ranks and prunes per step.
    reqs = [_req(0, 0.0, 700, 2), _req(1, 0.001, 200, 2), _req(2, 0.5, 100, 2)]  # r0: 512 + 188 with r1's 200
    eng = InstanceEngine(_cfg(instances=2, prefill_instances=1), reqs)
    seen, add = [], eng.network.add_flow
    eng.network.add_flow = lambda flow, done=None: (seen.append(flow), add(flow, done))[1]
    eng.run()
    assert [(f.id, f.batch, f.request) for f in seen] == [("r0.kv", "i0.s1", "r0"), ("r1.kv", "i0.s1", "r1"),
                                                         ("r2.kv", "i0.s2", "r2")]
