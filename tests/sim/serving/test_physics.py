"""``--physics paper``: the MFS paper's modeling choices, each on its own and all four together.

Pair-wise EP dispatch bytes, fair sharing per flow group, compute from the paper's collective share,
and the workload's reuse realized; the faithful defaults stay bit for bit what they were (the digests
of ``bench/sim_digest.py``), so these tests check each choice against the paper's own description.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from serving_factories import BLOCK, create_config, create_request, run

from laxflow.errors import UserError
from laxflow.policy.fair_sharing import FairSharing
from laxflow.policy.flow import Flow, Stage
from laxflow.sim import models
from laxflow.sim.events import EventQueue
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import PHYSICS, ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, rates_at
from laxflow.sim.serving.plan import ModelRunner


def test_pairwise_dispatch_sends_every_token_to_each_of_its_experts_gpus():
    """Pair-wise: k x expert_tp copies of each token spread over the unit; several times the inter-node
    bytes of hierarchical dispatch (which sends once per token and remote node) on the paper's MoE units."""
    for name, low, high in (("mixtral-8x22b", 4.0, 4.6), ("dbrx", 2.5, 3.0)):
        model, dep = models.get_model(name), models.get_deployment(name)
        hier = models.collective_bytes_per_layer(model, dep, 8192)
        pair = models.collective_bytes_per_layer(model, replace(dep, ep_comm="pairwise"), 8192)
        per_gpu = model.top_k * dep.expert_tp * 8192 * model.hidden * model.dtype_bytes / dep.gpus
        assert pair.ep_dispatch_bytes == pytest.approx(per_gpu)
        assert pair.ep_combine_bytes == pytest.approx(per_gpu)
        assert low < pair.inter_node_bytes / hier.inter_node_bytes < high, name


def test_pairwise_plan_is_a_uniform_all_to_all_over_the_unit():
    config = create_config("mixtral-8x7b", servers=4, ep_comm="pairwise")
    runner = ModelRunner(config.model, None, config.ep_comm)
    cluster = Cluster(config.cluster.resolve(8, 100.0, 7200.0), runner.unit_gpus)
    unit = cluster.prefill_units[0]
    plan = runner.plan(cluster, unit, [4096], [4096])
    dispatch = next(s for s in plan.segments if s.name == "ep-dispatch")
    assert dispatch.pattern is cluster.collective(unit, "uniform", [list(range(len(unit.gpus)))])
    assert runner.deployment.ep_comm == "pairwise"
    with pytest.raises(UserError, match="ep_comm.*pairwise"):
        ServingConfig(ep_comm="flat")


def _nic0_race(fairness: str) -> float:
    """A 4-GPU all-to-all (GPU 0 sends to 3 peers) and one P2D flow out of GPU 0's NIC under FS: when the
    P2D flow (1 s alone) lands."""
    cluster = Cluster(ClusterConfig(servers=8, gpus_per_server=1, nic_gbps=100.0, nvswitch_gbps=7200.0,
                                    topology="big-switch", fairness=fairness), 4)
    queue = EventQueue()
    network = FluidNetwork(cluster.topology, FairSharing(), queue)
    cap = cluster.config.nic_bytes_per_s
    coll = cluster.collective(cluster.prefill_units[0], "uniform", [[0, 1, 2, 3]])
    kv = cluster.transfer((0,), (5,))
    done: dict[str, float] = {}
    for fid, stage, payload, pat in (("a2a", Stage.COLLECTIVE, 100 * cap, coll), ("kv", Stage.P2D, cap, kv)):
        net = payload * pat.net_bytes
        flow = Flow(id=fid, size=net / pat.pairs, links=pat.links, weights=pat.weights, stage=stage)
        network.add_flow(flow, lambda f: done.__setitem__(f.id, queue.now))
    queue.run()
    return done["kv"]


def test_group_fairness_gives_a_wide_collective_one_share_at_a_shared_nic():
    """Per QP the all-to-all's 3 flows out of GPU 0 take 3 of 4 shares (P2D lands at 4 s); per flow
    group (the paper's FS, §6.3) it is one flow there, 50/50 with the P2D flow (lands at 2 s)."""
    assert _nic0_race("qp") == pytest.approx(4.0, rel=1e-9)
    assert _nic0_race("group") == pytest.approx(2.0, rel=1e-9)


def test_group_fairness_keeps_a_groups_bytes_and_its_idle_time():
    for topology in ("big-switch", "fat-tree"):
        pats = {}
        for fairness in ("qp", "group"):
            cluster = Cluster(ClusterConfig(servers=8, gpus_per_server=4, nic_gbps=100.0, nvswitch_gbps=7200.0,
                                            topology=topology, nics_per_leaf=8, fairness=fairness), 16)
            pats[fairness] = cluster.collective(cluster.prefill_units[0], "uniform", [list(range(16))])
        qp, group = pats["qp"], pats["group"]
        assert group.net_bytes == qp.net_bytes and group.bottleneck == qp.bottleneck
        assert float(group.weights.max()) == 1.0
        # The same bytes per link per unit of time alone: weight x rate unchanged, size x weight unchanged.
        np.testing.assert_allclose(group.weights * qp.pairs / group.pairs, qp.weights)


def test_comm_share_scales_compute_so_the_collectives_are_that_share_of_an_idle_layer():
    config = create_config("mixtral-8x7b", servers=4)
    cluster = Cluster(config.cluster.resolve(8, 100.0, 7200.0), 8)
    nvswitch = cluster.config.nvswitch_bytes_per_s
    roofline = ModelRunner("mixtral-8x7b", None)
    paper = ModelRunner("mixtral-8x7b", None, comm_share=0.6)
    unit = cluster.prefill_units[0]
    for tokens in (512, 4096, 8192):
        base, plan = roofline.plan(cluster, unit, [tokens], [tokens]), paper.plan(cluster, unit, [tokens], [tokens])
        cct = plan.idle_cct(nvswitch)
        assert cct == base.idle_cct(nvswitch)  # only compute moves
        assert cct / (cct + plan.compute) == pytest.approx(0.6)
        assert plan.compute == pytest.approx(sum(s.seconds for s in plan.segments if s.kind == "compute"))
    with pytest.raises(UserError, match="comm_share"):
        ServingConfig(comm_share=1.0)


def test_a_layer_without_collectives_keeps_its_roofline_compute():
    cluster = Cluster(ClusterConfig(servers=2, gpus_per_server=8, nic_gbps=100.0, nvswitch_gbps=7200.0), 1)
    unit = cluster.prefill_units[0]
    base = ModelRunner("llama3-8b", "llama3-8b-tp1-a800").plan(cluster, unit, [2048], [2048])
    paper = ModelRunner("llama3-8b", "llama3-8b-tp1-a800", comm_share=0.6).plan(cluster, unit, [2048], [2048])
    assert paper == base


PREFIX = tuple(range(9000, 9064))  # 64 blocks


def test_reuse_from_routed_realizes_a_prefix_whose_first_prefill_is_still_running():
    """r1 shares r0's prefix and arrives while r0 still computes it: stored, r1 computes it all again;
    routed (the workload's reuse, as the paper's traces count it), r1 reuses the whole prefix."""
    reqs = [create_request(0, 0.0, 80 * BLOCK, PREFIX), create_request(1, 0.001, 80 * BLOCK, PREFIX)]
    _, stored = run(create_config(servers=4), reqs)
    _, routed = run(create_config(servers=4, reuse_from="routed"), reqs)
    assert stored.states[1].route.reused_tokens == 0
    assert routed.states[1].route.reused_tokens == 64 * BLOCK
    assert routed.states[0].route.reused_tokens == 0
    with pytest.raises(UserError, match="reuse_from"):
        ServingConfig(reuse_from="later")


def test_with_physics_sets_every_choice_and_faithful_is_the_default():
    assert ServingConfig().physics == "faithful"
    assert ServingConfig().with_physics("faithful") == ServingConfig()
    paper = ServingConfig().with_physics("paper")
    assert paper.physics == "paper"
    assert (paper.ep_comm, paper.cluster.fairness, paper.comm_share, paper.reuse_from) == (
        "pairwise", "group", 0.6, "routed")
    half = replace(paper, comm_share=0.5)
    assert half.physics == "ep_comm=pairwise;fairness=group;comm_share=0.5;reuse_from=routed"
    assert ServingConfig().with_physics(half.physics) == half  # the spec reads back
    one = ServingConfig().with_physics("reuse_from=routed")
    assert one.physics_values == {**PHYSICS["faithful"], "reuse_from": "routed"}
    assert set(PHYSICS["paper"]) == set(PHYSICS["faithful"])
    for bad in ("vidur", "fairness", "speed=2"):
        with pytest.raises(UserError, match="physics.*paper"):
            ServingConfig().with_physics(bad)
    with pytest.raises(UserError, match="comm_share.*fast"):
        ServingConfig().with_physics("comm_share=fast")
    with pytest.raises(UserError, match="fairness"):
        ServingConfig().with_physics("fairness=per-byte")


def test_faithful_rates_are_the_capacity_table():
    assert rates_at("dbrx", "qwen-conv", (0.8,), "faithful") == (float(f"{CAPACITY[('dbrx', 'qwen-conv')] * 0.8:.2g}"),)


def test_cli_physics_paper_runs_the_preset_at_its_fractions_of_the_paper_capacity(laxflow_cli, tmp_path):
    out = tmp_path / "r.json"
    code, _, err = laxflow_cli("sim", "serve", "--preset", "fig13", "--physics", "paper", "--servers", "8",
                               "--requests", "12", "--warmup", "4", "--policies", "fs,mfs", "--quiet",
                               "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    meta = doc["config"]
    assert meta["physics"] == "paper" and meta["fairness"] == "group" and meta["ep_comm"] == "pairwise"
    assert meta["preset_rates"] == list(rates_at("dbrx", "qwen-conv", physics="paper"))
    assert meta["preset_rates"] != list(rates_at("dbrx", "qwen-conv"))


@pytest.mark.parametrize("args, words", [
    (["--physics", "vidur"], ["--physics", "vidur", "paper"]),
    (["--fairness", "per-byte"], ["--fairness", "per-byte", "group"]),
    (["--comm-share", "0"], ["--comm-share", "(0, 1)"]),
    (["--reuse-from", "never"], ["--reuse-from", "never", "routed"]),
    (["--ep-comm", "ring"], ["--ep-comm", "ring", "pairwise"]),
    (["--physics", "paper", "--prefill", "sarathi"], ["--physics", "instance engine"]),
])
def test_a_bad_physics_flag_is_one_clear_error(laxflow_cli, args, words):
    preset = [] if "--prefill" in args else ["--preset", "fig13"]
    code, out, err = laxflow_cli("sim", "serve", *preset, "--servers", "8", "--requests", "4", *args)
    assert code == 2, (out, err)
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    for w in words:
        assert w in line, line
