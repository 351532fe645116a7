"""``ServingConfig.decode = "steps"`` (``--decode steps``): the prefill units' requests decode on decode instances."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cli_runner import cli
from serving_factories import create_config, create_request, run

from laxflow.errors import UserError
from laxflow.sim.models import get_deployment
from laxflow.sim.serving.instances.profile import StepTimer
from laxflow.sim.serving.metrics import summarize


def _requests(outputs: list[int]):
    return [replace(create_request(i, 0.05 * i, 300 + 40 * i), output_tokens=n) for i, n in enumerate(outputs)]


def test_each_request_decodes_its_outputs_after_its_last_p2d_byte():
    reqs = _requests([5, 1, 3, 8])
    _, hold = run(create_config(decode="hold"), reqs)
    sim, steps = run(create_config(), reqs)  # decode steps: the default
    # One decode unit (2 servers: one prefill, one decode): the same route, so the same TTFT to the last float.
    assert [s.finish for s in steps.states] == [s.finish for s in hold.states]
    timer = StepTimer(get_deployment("mixtral-8x7b"))
    for state in steps.states:
        seq = steps.decode[state.index]
        outputs = int(state.request.output_tokens)
        assert len(seq.token_times) == outputs and seq.done
        assert seq.token_times[0] == seq.kv_landed == state.finish and seq.prefill_end == state.compute_end
        assert all(b > a for a, b in zip(seq.token_times, seq.token_times[1:]))
    alone = steps.decode[3]  # the last to arrive decodes alone at the end: one decode step per token
    assert alone.token_times[-1] - alone.token_times[-2] == pytest.approx(timer.seconds([(1, 300 + 120 + 6)]))
    assert sim.decode_tokens == [0.0]  # every request left its decode unit
    row = summarize(steps, 1.0)
    assert row["tpot_mean"] > 0 and row["tbt_max"] >= row["tbt_p99"] > 0 and row["preemptions"] == 0
    assert row["tpot_attainment"] is None and row["tdg_ratio"] is None  # no TPOT SLO on these workloads
    assert summarize(hold, 1.0)["tpot_mean"] is None


def test_decode_units_must_be_one_replica_and_the_mode_must_be_known():
    with pytest.raises(UserError, match=r"decode: unknown 'real' \(expected one of hold, steps\)"):
        create_config(decode="real")
    with pytest.raises(UserError, match="a decode unit runs one replica of 'mixtral-8x7b' .8 GPUs., but the "
                                        "cluster's decode units have 4 GPUs"):
        run(create_config(decode="steps", decode_unit_gpus=4), _requests([2]))


def test_decode_flag_on_the_command_line(capsys):
    base = ["sim", "serve", "--quiet", "--model", "mixtral-8x7b", "--servers", "2", "--requests", "6", "--warmup",
            "0", "--jobs", "1", "--policies", "fs", "--workload", "qwen-conv"]
    code, out, err = cli(capsys, *base, "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["decode"] == "steps" and data["results"][0]["tpot_mean"] > 0  # the default
    code, out, err = cli(capsys, *base, "--decode", "hold", "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["decode"] == "hold" and data["results"][0]["tpot_mean"] is None
    code, _, err = cli(capsys, *base, "--decode", "real")
    assert code == 2 and "--decode: expected one of hold, steps, got 'real'" in err
    code, _, err = cli(capsys, *base, "--decode", "steps", "--instances", "1:1")
    assert code == 2 and "--decode: only for the MFS prefill units" in err


def test_a_request_larger_than_a_decode_units_kv_is_refused_before_the_run():
    big = replace(create_request(0, 0.0, 300), output_tokens=10_000_000)
    with pytest.raises(UserError, match=r"request r0: 300 prompt \+ 10000000 output tokens exceed a decode unit's KV"
                                        r".*; --decode hold runs no decode, so it does not need the memory"):
        run(create_config(), [big])
    _, held = run(create_config(decode="hold"), [replace(big, id="r1")])  # the hold asks no memory
    assert held.states[0].finish > 0


def test_a_tpot_slo_gives_the_token_attainments_on_the_prefill_units():
    reqs = _requests([6, 1, 4, 9])
    _, plain = run(create_config(), reqs)
    assert summarize(plain, 1.0)["tpot_attainment"] is None  # no TPOT SLO: measured, not judged
    _, result = run(create_config(tpot_slo=0.003405), reqs)
    row = summarize(result, 1.0)
    seqs = [result.decode[s.index] for s in result.measured]
    # By hand from the token times: TPOT over (outputs - 1) gaps (0 for one output); the envelope per token.
    tpot = [(s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1) if len(s.token_times) > 1 else 0.0
            for s in seqs]
    assert row["tpot_slo"] == 0.003405 and row["tpot_attainment"] == 0.5  # TPOTs near 3.40 ms: split
    assert row["tpot_attainment"] == sum(t <= 0.003405 for t in tpot) / len(seqs)
    envelope = [all(t <= s.arrival + s.ttft_slo + i * 0.003405 for i, t in enumerate(s.token_times)) for s in seqs]
    assert row["envelope_attainment"] == sum(envelope) / len(seqs)
    assert [s.ttft_slo for s in seqs] == [s.slo for s in result.measured]  # TTFT judged by its own SLO
    assert row["slo_attainment"] == summarize(plain, 1.0)["slo_attainment"]  # still TTFT's: the MFS metric
    assert row["tdg_ratio"] is None
    with pytest.raises(UserError, match="tpot_slo: expected a positive number, got -1"):
        create_config(tpot_slo=-1)


def test_the_workload_s_tpot_slo_is_the_default_and_the_flag_overrides_it(capsys):
    base = ["sim", "serve", "--quiet", "--model", "mixtral-8x7b", "--servers", "2", "--requests", "6", "--warmup",
            "0", "--jobs", "1", "--policies", "fs"]
    code, out, err = cli(capsys, *base, "--workload", "qwen-trace", "--json", "-")  # an SLO workload: 50 ms
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["tpot_slo"] is None and data["results"][0]["tpot_attainment"] is not None
    code, out, err = cli(capsys, *base, "--workload", "qwen-conv", "--tpot-slo", "0.5", "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["tpot_slo"] == 0.5 and data["results"][0]["tpot_attainment"] == 1.0
    code, _, err = cli(capsys, *base, "--workload", "qwen-conv", "--json", "-")  # an MFS workload: none
    assert code == 0 and json.loads(_)["results"][0]["tpot_attainment"] is None
    code, _, err = cli(capsys, *base, "--tpot-slo", "0")
    assert code == 2 and "--tpot-slo: expected a positive number of seconds, got 0.0" in err
    # The instance engine takes the same flag over its workload's SLO.
    inst = ["sim", "serve", "--quiet", "--requests", "8", "--warmup", "0", "--jobs", "1", "--policies", "fs",
            "--prefill", "sarathi", "--instances", "1:1", "--workload", "qwen-trace", "--rate", "2"]
    code, out, err = cli(capsys, *inst, "--json", "-")
    assert code == 0, err
    assert json.loads(out)["results"][0]["tpot_slo"] == 0.05  # qwen-trace's
    code, out, err = cli(capsys, *inst, "--tpot-slo", "0.2", "--json", "-")
    assert code == 0, err
    assert json.loads(out)["results"][0]["tpot_slo"] == 0.2
