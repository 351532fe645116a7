"""mfs+flowprefill end to end in the simulator: MFS with pruning on (``MfsPruning``) feeds the prefill
units' deferral on a network-bound cluster; plain standalone ``mfs`` prunes nothing (drop_budget 0)."""

from __future__ import annotations

from dataclasses import replace

from laxflow.policy.registry import create_policy
from laxflow.sim.serving.experiment import RunSpec, build_workload, get_preset
from laxflow.sim.serving.prefill_driver import MfsPruning
from laxflow.sim.serving.simulator import ServingSimulator

PRUNING = "laxflow.sim.serving.prefill_driver:MfsPruning"


def test_mfs_pruning_is_mfs_with_a_drop_budget():
    p = create_policy(PRUNING)
    assert isinstance(p, MfsPruning) and p.config.drop_budget == 1 and p.name == "mfs-prune"
    assert create_policy("mfs").config.drop_budget == 0
    assert MfsPruning(drop_budget=3).config.drop_budget == 3


def _run(policy: str):
    preset = get_preset("fig12-conv")  # Llama3-8B TP4 SP4: SP rings and P2D share the NICs
    config = replace(preset.config(), warmup=10, prefill="flowprefill", router_dispatch="ttft")
    config = replace(config, cluster=replace(config.cluster, servers=4, nic_gbps=25.0))  # network-bound
    spec = RunSpec(config, preset.workload, 0.6, policy, 50, 0, prefill="flowprefill")
    sim = ServingSimulator(config, build_workload(spec), policy)
    result = sim.run()
    return sim, result


def test_pruned_requests_are_deferred_by_the_prefill_units_and_still_finish():
    sim, result = _run(PRUNING)
    assert sim.policy.pruned_requests and sum(d.deferrals for d in sim.drivers) > 0
    assert all(s.finish is not None for s in result.states)  # deferred, not dropped
    assert all(d.scheduler.idle() and not d.deferred for d in sim.drivers)
    plain, _ = _run("mfs")
    assert not plain.policy.pruned_requests and sum(d.deferrals for d in plain.drivers) == 0
