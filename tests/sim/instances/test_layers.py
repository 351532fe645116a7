"""Per-layer P2D (``InstanceSimConfig.p2d = "layer"``, ``instances/layers.py``) on the real engine: each chunk's KV
leaves layer by layer as the step computes it; the first token is unchanged, the KV lands sooner."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.sim.models import get_deployment
from laxflow.sim.serving.instances import InstanceEngine, InstanceSimConfig
from laxflow.sim.serving.instances.pools import LazyPoolDispatcher
from laxflow.sim.serving.instances.profile import StepTimer
from laxflow.sim.workload.request import Request

DEP = "llama3-8b-tp1-a800"
PORT = get_deployment(DEP).nic_gbps * 1e9 / 8  # the port placement: one NIC per TP1 instance
L = 32  # llama3-8b's layers


def _cfg(**kw) -> InstanceSimConfig:
    base = dict(deployment=DEP, instances=2, prefill_instances=1, scheduler="sarathi", router="dplb", ttft_slo=1.0,
                tpot_slo=0.1)
    return InstanceSimConfig(**{**base, **kw})


def _req(i: int, arrival: float, prompt: int, outputs: int) -> Request:
    return Request(id=f"r{i}", arrival=arrival, input_tokens=prompt, output_tokens=outputs)


def _spy(engine: InstanceEngine) -> list:
    """Every flow the engine adds to its network, with the time it was added."""
    seen, add = [], engine.network.add_flow
    engine.network.add_flow = lambda flow, done=None: (seen.append((engine.queue.now, flow)), add(flow, done))[1]
    return seen


def _leak_free(engine: InstanceEngine) -> None:
    assert not engine._handed and all(not i.seqs and not i.outbound for i in engine.instances.values())
    assert all(s.p2d_pending == 0 and not s.p2d_live and s.p2d_target is None for s in engine.seqs)


def test_a_prompts_kv_leaves_per_layer_and_only_the_last_layer_is_left_after_its_step():
    eng = InstanceEngine(_cfg(p2d="layer"), [_req(0, 0.0, 2000, 3)])
    flows = _spy(eng)
    s = eng.run().seqs[0]
    old = InstanceEngine(_cfg(), [_req(0, 0.0, 2000, 3)]).run().seqs[0]
    t = StepTimer(DEP)
    per_token = t.kv_bytes_per_token()
    assert s.prefill_end == old.prefill_end  # the first token is emitted on the prefill instance, as before
    assert old.token_times[0] - old.prefill_end == pytest.approx(2000 * StepTimer(DEP).kv_bytes_per_token() / PORT)
    assert s.token_times[0] == s.kv_landed < old.kv_landed  # and seen when the KV lands: sooner, layer by layer
    # 4 chunks (512, 512, 512, 464) x 32 layers; only the last chunk's last layer moves after the step's end.
    assert [f.id for _, f in flows] == [f"r0.L{j}.p2d" for _ in range(4) for j in range(L)]
    assert [f.layer for _, f in flows] == list(range(L)) * 4
    assert {f.deadline for _, f in flows} == {1.0} and {f.batch for _, f in flows[:L]} == {"i0.s0"}
    assert sum(f.size for _, f in flows) == pytest.approx(2000 * per_token)
    assert flows[-1][0] == s.prefill_end and flows[-1][1].downstream == 0.0 and flows[-1][1].compute_done
    # One P2D rule on both engines (as batch.py's): nothing of the request waits for a layer's KV but its TTFT.
    assert {f.downstream for _, f in flows} == {0.0}
    assert not flows[L - 1][1].compute_done  # an earlier chunk: the prompt still computes
    last = 464 * per_token / L
    assert s.kv_landed == pytest.approx(s.prefill_end + last / PORT, rel=1e-9)
    assert s.token_times[1] == pytest.approx(s.prefill_end + last / PORT + t.seconds([(1, 2000)]), rel=1e-9)
    assert s.token_times[1] < old.token_times[1]
    assert eng.p2d_bytes == 2000 * per_token == eng.fabric.delivered["p2d"]
    _leak_free(eng)


def test_layer_boundaries_split_the_step_and_the_last_is_its_end():
    eng = InstanceEngine(_cfg(p2d="layer"), [_req(0, 0.0, 400, 2)])
    flows = _spy(eng)
    s = eng.run().seqs[0]
    secs = StepTimer(DEP).seconds([(400, 0)])
    assert [at for at, _ in flows[:-1]] == [secs * (j + 1) / L for j in range(L - 1)]
    assert flows[-1][0] == secs == s.prefill_end


def test_ideal_network_layered_equals_prompt_and_moves_no_flow():
    reqs = [_req(i, 0.004 * i, 600 + 150 * i, 4) for i in range(10)]
    runs = {p2d: InstanceEngine(_cfg(instances=3, prefill_instances=2, network="ideal", p2d=p2d), reqs)
            for p2d in ("prompt", "layer")}
    res = {p2d: eng.run() for p2d, eng in runs.items()}
    assert [s.token_times for s in res["prompt"].seqs] == [s.token_times for s in res["layer"].seqs]
    assert res["layer"].network_events == 0 and res["layer"].p2d_bytes == pytest.approx(res["prompt"].p2d_bytes)
    _leak_free(runs["layer"])


def test_colocated_and_decode_steps_stay_one_event():
    reqs = [_req(i, 0.01 * i, 300 + 50 * i, 4) for i in range(12)]
    times = {p2d: [s.token_times for s in InstanceEngine(_cfg(instances=2, prefill_instances=None, p2d=p2d),
                                                          reqs).run().seqs] for p2d in ("prompt", "layer")}
    assert times["prompt"] == times["layer"]


def test_disaggregated_and_pool_runs_finish_with_nothing_held():
    reqs = [_req(i, 0.003 * i, 500 + 97 * i, 3 + i % 5) for i in range(24)] + [_req(99, 0.01, 700, 1)]
    eng = InstanceEngine(_cfg(instances=4, prefill_instances=2, p2d="layer"), reqs)
    res = eng.run()
    assert all(s.done for s in res.seqs)
    moved = [s for s in res.seqs if s.target_outputs > 1]  # r99 ends with its first token: no KV moves for it
    assert res.p2d_bytes == sum(s.prompt for s in moved) * StepTimer(DEP).kv_bytes_per_token()
    _leak_free(eng)
    arrow = InstanceEngine(_cfg(instances=4, prefill_instances=2, pools="arrow", p2d="layer"),
                           [_req(i, 0.001 * i, 4096, 4) for i in range(24)], dispatcher=LazyPoolDispatcher("arrow", 2))
    assert all(s.done for s in arrow.run().seqs)
    _leak_free(arrow)


def test_bad_p2d_mode_is_one_error():
    with pytest.raises(UserError, match=r"p2d: unknown 'chunk' \(expected one of prompt, layer\)"):
        _cfg(p2d="chunk")


def test_a_recompute_preemption_sends_the_kv_again():
    from laxflow.sim.serving.instances.instance import Instance, Seq

    inst = Instance("i0", "prefill", {}, 10_000, StepTimer(DEP))
    seq = Seq("r0", 0.0, 2000, 3, 1.0, 0.1, computed=1024, p2d_target="i1", p2d_sent=1024)
    inst.add(seq)
    assert inst._preempt_one() and seq.computed == 0 and seq.p2d_sent == 0 and seq.p2d_target == "i1"
