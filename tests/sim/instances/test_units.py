"""Prefill units on the instance engine (``instances/unit.py``): a prefill scheduler in ``--prefill`` with
``--instances P:D`` runs the unit engine's prefill model (whole-prompt tasks, the layer plan's collectives and
per-layer P2D as flows) beside the instance engine's decode instances."""

from __future__ import annotations

import json
import random

import pytest

from laxflow.errors import UserError
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.instances import InstanceEngine, InstanceSimConfig
from laxflow.sim.serving.instances.unit import UnitInstance
from laxflow.sim.serving.metrics import summarize
from laxflow.sim.serving.simulator import ServingSimulator
from laxflow.sim.workload.request import Request


def _requests(n: int, seed: int = 1, rate: float = 4.0) -> list[Request]:
    """Poisson arrivals, prompts of 200-6000 tokens with prefixes of their own (no reuse), 1-60 outputs."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        prompt = rng.randint(200, 6000)
        out.append(Request(f"r{i}", t, prompt, rng.randint(1, 60), tuple(range(i * 10_000, i * 10_000 + prompt // 16))))
    return out


def _both(model: str, dep: str, cluster: ClusterConfig, scheduler: str, policy: str, reqs: list[Request]):
    """The unit engine with --decode steps, and the instance engine with one prefill unit and one decode instance
    on the same servers, each request given the unit engine's SLO (its deadline orders flowprefill and MFS)."""
    config = ServingConfig(model=model, deployment=dep, cluster=cluster, warmup=0, decode="steps", prefill=scheduler,
                           slo_scale=1.0)
    unit = ServingSimulator(config, reqs, policy).run()
    engine = InstanceEngine(InstanceSimConfig(deployment=dep, instances=2, prefill_instances=1, scheduler=scheduler,
                                              placement="cluster", p2d="layer", cluster=cluster, flow_policy=policy),
                            reqs)
    slo = {s.id: s.slo for s in unit.states}
    for s in engine.seqs:
        s.ttft_slo = slo[s.id]
    return unit, engine, engine.run()


@pytest.mark.parametrize("model,dep,servers,gps,scheduler,policy", [
    ("llama3-8b", "llama3-8b-tp1-a800", 2, 1, "fcfs", "fs"),  # FlowPrefill's 1P1D: only P2D crosses the network
    ("llama3-8b", "llama3-8b-tp1-a800", 2, 1, "flowprefill", "mfs"),
    ("llama3-8b", "llama3-8b", 4, None, "flowprefill", "laxflow.sim.serving.prefill_driver:MfsPruning"),  # TP4 SP4
    ("mixtral-8x7b", "testbed-mixtral-8x7b", 4, None, "fcfs", "mfs"),  # EP8 over two servers of 4 GPUs
])
def test_a_unit_on_the_instance_engine_is_the_unit_engines_unit_to_the_bit(model, dep, servers, gps, scheduler,
                                                                          policy):
    reqs = _requests(24)
    unit, engine, res = _both(model, dep, ClusterConfig(servers=servers, gpus_per_server=gps), scheduler, policy, reqs)
    states = {s.id: s for s in unit.states}
    decoded = {s.id: s for s in unit.decode.values()}
    for s in res.seqs:
        assert s.prefill_end == states[s.id].compute_end and s.kv_landed == states[s.id].finish
        assert s.token_times == decoded[s.id].token_times  # first token at the last P2D byte, then decode steps
    assert engine.fabric.delivered == unit.stage_bytes_delivered
    assert [b.cct for b in engine.batches] == [b.cct for b in unit.batches]
    if dep != "llama3-8b-tp1-a800":
        assert engine.fabric.delivered["collective"] > 0  # the layer plan's collectives are flows here too
    inst = engine.instances["i0"]
    assert isinstance(inst, UnitInstance) and not inst.seqs and not inst.outbound and not inst.driver.runs
    assert all(not i.seqs for i in engine.instances.values())


def test_the_row_reads_the_units_collectives_stalls_and_deferrals():
    reqs = _requests(30, seed=3, rate=8.0)
    cluster = ClusterConfig(servers=4)
    engine = InstanceEngine(InstanceSimConfig(deployment="testbed-mixtral-8x7b", instances=2, prefill_instances=1,
                                              scheduler="fcfs", placement="cluster", p2d="layer", cluster=cluster,
                                              flow_policy="fs"), reqs)
    row = summarize(engine.run(), 1.0, {"policy": "fs", "prefill": "fcfs", "router": "dplb", "instances": "1:1"},
                    engine=engine)
    assert row["cct_mean"] > 0 and row["cct_inflation"] >= 1.0 - 1e-9 and row["deferred"] == 0
    assert row["network_bytes_by_stage"]["collective"] > 0 and row["tpot_mean"] > 0
    assert row["nonoverlap_mean"] == pytest.approx(
        sum(engine.unit_states[s.id].stall for s in engine.seqs) / len(engine.seqs))
    assert row["batches"] == len(engine.batches) + engine.instances["i1"].steps


def test_two_units_and_two_decode_instances_share_the_fabric_and_finish_clean():
    reqs = _requests(40, seed=5, rate=12.0)
    engine = InstanceEngine(InstanceSimConfig(deployment="llama3-8b-tp1-a800", instances=4, prefill_instances=2,
                                              scheduler="flowprefill", placement="cluster", p2d="layer",
                                              cluster=ClusterConfig(servers=4, gpus_per_server=1), flow_policy="mfs"),
                            reqs)
    res = engine.run()
    assert all(s.done for s in res.seqs)
    assert {s.prefill_instance for s in res.seqs} == {"i0", "i1"} and {s.decode_instance for s in res.seqs} == {"i2", "i3"}
    for s in res.seqs:
        assert s.prefill_end < s.kv_landed == s.token_times[0] and len(s.token_times) == s.target_outputs
    assert engine.p2d_bytes == pytest.approx(engine.fabric.delivered["p2d"])
    assert all(not i.seqs and not i.outbound for i in engine.instances.values())


@pytest.mark.parametrize("kw,expect", [
    (dict(prefill_instances=None), "give --instances P:D"),
    (dict(pools="arrow"), "a unit cannot flip to decode"),
    (dict(placement="ports"), "not --placement ports --p2d layer"),
    (dict(p2d="prompt"), "not --placement cluster --p2d prompt"),
])
def test_prefill_units_outside_their_layout_are_one_error(kw, expect):
    base = dict(deployment="llama3-8b-tp1-a800", instances=2, prefill_instances=1, scheduler="flowprefill",
                placement="cluster", p2d="layer")
    with pytest.raises(UserError, match=expect):
        InstanceSimConfig(**{**base, **kw})


def test_a_scheduler_that_is_neither_kind_names_both_lists():
    with pytest.raises(UserError, match=r"neither an iteration-level batch scheduler .* nor a prefill scheduler"):
        InstanceSimConfig(scheduler="nope")


def test_the_cli_runs_prefill_units_with_the_units_layout_by_default(laxflow_cli):
    code, out, err = laxflow_cli("sim", "serve", "--workload", "qwen-trace", "--requests", "20", "--warmup", "4",
                                 "--jobs", "1", "--quiet", "--prefill", "fcfs,flowprefill", "--instances", "1:1",
                                 "--model", "llama3-8b", "--servers", "4", "--rate", "0.5", "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert (data["config"]["p2d"], data["config"]["placement"]) == ("layer", "cluster")
    rows = {r["prefill"]: r for r in data["results"]}
    assert set(rows) == {"fcfs", "flowprefill"}
    for r in rows.values():
        assert r["deferred"] == 0 and r["tpot_mean"] > 0 and r["cct_mean"] > 0
        assert r["network_bytes_by_stage"]["p2d"] > 0 and r["network_bytes_by_stage"]["collective"] > 0


def test_an_ideal_network_moves_the_units_bytes_at_no_cost():
    reqs = _requests(16, seed=7)
    runs = {}
    for net in ("fabric", "ideal"):
        engine = InstanceEngine(InstanceSimConfig(deployment="testbed-mixtral-8x7b", instances=2, prefill_instances=1,
                                                  scheduler="fcfs", placement="cluster", p2d="layer", network=net,
                                                  cluster=ClusterConfig(servers=4), flow_policy="fs"), reqs)
        added, add = [], engine.network.add_flow
        engine.network.add_flow = lambda flow, done=None, add=add, added=added: (added.append(flow), add(flow, done))[1]
        runs[net] = (engine, engine.run(), added)
    (fabric, fres, fflows), (ideal, ires, iflows) = runs["fabric"], runs["ideal"]
    assert not iflows and {f.stage.value for f in fflows} == {"collective", "p2d"}  # no flow reaches the network
    assert ideal.fabric.delivered == pytest.approx(fabric.fabric.delivered)  # the same bytes, moved for free
    assert all(i.kv_landed <= f.kv_landed for i, f in zip(ires.seqs, fres.seqs))
    assert sum(s.kv_landed - s.arrival for s in ires.seqs) < sum(s.kv_landed - s.arrival for s in fres.seqs)
