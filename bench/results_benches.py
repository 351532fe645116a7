"""The benches ``make results`` runs: name, command, what it measures.

Read by ``bench/results.py`` (which runs them) and ``bench/results_render.py``
(which names each bench's command on the pages); each bench is its script
with ``--json`` or the arguments its docstring documents, at the scale named
here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bench:
    """One benchmark run: ``args`` after ``python``, from the repository root."""

    name: str
    args: tuple[str, ...]
    about: str
    needs_root: bool = False
    fresh: tuple[str, ...] = field(default=())  # scratch paths removed before a fresh run


CLAIMS_POINTS = "fig10-mixtral,fig10-dbrx,fig11-mixtral,fig11-dbrx,fig12-conv,fig12-agent,fig13,testbed-qwenA"
PHYSICS_POINTS = "fig10-mixtral,fig10-dbrx,fig11-mixtral,fig11-dbrx,fig12-conv,fig12-agent,fig13"  # Figs. 10-13
SWEEP_POINTS = "fig10-mixtral,fig10-dbrx,fig11-mixtral,fig11-dbrx,fig12-conv,fig12-agent"  # fig13 = fig10-dbrx's point
# At the paper's scale the agent points (Figs. 11, 12b) saturate at 0.8 (MFS met 0.2-0.3 % of SLOs at seed 0): left out.
SCALE_POINTS = "fig10-mixtral,fig10-dbrx,fig12-conv"
ONE_JOB_POLICIES = "fs,edf,mfs,sjf-group,karuna-group"  # the baselines as the paper's text describes them
ABLATION_POINTS = "fig10-mixtral,fig11-dbrx,fig12-agent,fig13"
# Each of the paper's four modeling choices alone over the faithful model (config.parse_physics), and both ends.
ABLATION_PHYSICS = "faithful,ep_comm=pairwise,fairness=group,comm_share=0.6,reuse_from=routed,paper"
# Every baseline both ways: SJF and Karuna sizing a collective per queue pair and as one job (sjf-group, karuna-group).
GROUP_POLICIES = "fs,sjf,edf,karuna,mfs,sjf-group,karuna-group"
CLAIMS_SCALE = ("--seeds", "5", "--servers", "16", "--requests", "200", "--warmup", "100", "--jobs", "2")

BENCHES: dict[str, Bench] = {b.name: b for b in (
    # Paper reproductions (docs/results/<paper>.md).
    Bench("sim_claims", ("bench/sim_claims.py", "--points", CLAIMS_POINTS, "--fraction", "0.8", *CLAIMS_SCALE,
                         "--out", "out/results/sim_claims"),
          "MFS Figs. 9-13: SLO attainment per policy at 0.8 of capacity, 16 servers, 5 seeds, decode batches on the "
          "decode units (the run resumes with --resume)",
          fresh=("out/results/sim_claims",)),
    Bench("sim_claims_hold", ("bench/sim_claims.py", "--points", CLAIMS_POINTS, "--fraction", "0.8", *CLAIMS_SCALE,
                              "--decode", "hold", "--out", "out/results/sim_claims_hold"),
          "MFS Figs. 9-13 as sim_claims with each decode unit held output tokens x 30 ms instead of decoding "
          "(--decode hold, the MFS paper's simulator)",
          fresh=("out/results/sim_claims_hold",)),
    Bench("sim_claims_paper", ("bench/sim_claims.py", "--points", PHYSICS_POINTS, "--fraction", "0.8", *CLAIMS_SCALE,
                               "--physics", "paper", "--out", "out/results/sim_claims_paper"),
          "MFS Figs. 10-13 under the paper's physics (--physics paper), as sim_claims otherwise",
          fresh=("out/results/sim_claims_paper",)),
    Bench("sim_claims_paper_hold", ("bench/sim_claims.py", "--points", PHYSICS_POINTS, "--fraction", "0.8",
                                    *CLAIMS_SCALE, "--physics", "paper", "--decode", "hold",
                                    "--out", "out/results/sim_claims_paper_hold"),
          "sim_claims_paper with each decode unit held output tokens x 30 ms instead of decoding (--decode hold)",
          fresh=("out/results/sim_claims_paper_hold",)),
    Bench("sim_physics_sweep", ("bench/sim_claims.py", "--points", SWEEP_POINTS, "--fractions", "0.5,0.6,0.7,0.8",
                                *CLAIMS_SCALE, "--physics", "faithful,paper", "--out", "out/results/sim_physics_sweep"),
          "MFS Figs. 10-12 against load (0.5-0.8 of capacity) under both physics",
          fresh=("out/results/sim_physics_sweep",)),
    Bench("sim_physics_ablation", ("bench/sim_claims.py", "--points", ABLATION_POINTS, "--fraction", "0.8",
                                   *CLAIMS_SCALE, "--physics", ABLATION_PHYSICS,
                                   "--out", "out/results/sim_physics_ablation"),
          "which of the paper's four modeling choices moves MFS's margin: each alone at 0.8 of capacity",
          fresh=("out/results/sim_physics_ablation",)),
    Bench("sim_claims_baselines", ("bench/sim_claims.py", "--points", PHYSICS_POINTS, "--fraction", "0.8",
                                   *CLAIMS_SCALE, "--physics", "faithful,paper", "--policies", GROUP_POLICIES,
                                   "--out", "out/results/sim_claims_baselines"),
          "MFS Figs. 10-13 under both physics with SJF and Karuna also sizing a collective as one job",
          fresh=("out/results/sim_claims_baselines",)),
    Bench("sim_claims_scale", ("bench/sim_claims.py", "--points", SWEEP_POINTS, "--fraction", "0.7", "--seeds", "3",
                               "--servers", "32", "--requests", "500", "--warmup", "200", "--jobs", "2",
                               "--physics", "paper", "--policies", GROUP_POLICIES, "--out", "out/results/sim_claims_scale"),
          "Figs. 10-12 under the paper's physics at twice the cluster and longer runs (32 servers, 200 + 500 "
          "requests, 0.7 of capacity), both baseline semantics",
          fresh=("out/results/sim_claims_scale",)),
    Bench("sim_claims_paper_scale", ("bench/sim_claims.py", "--points", SCALE_POINTS, "--fraction", "0.8", "--seeds",
                                     "3", "--servers", "256", "--requests", "1536", "--warmup", "512", "--jobs", "2",
                                     "--physics", "paper", "--policies", ONE_JOB_POLICIES,
                                     "--out", "out/results/sim_claims_paper_scale"),
          "Figs. 10, 12a and 13 under the paper's physics at the paper's scale (256 servers, 512 + 1536 requests, "
          "0.8 of capacity), over the one-job baselines",
          fresh=("out/results/sim_claims_paper_scale",)),
    Bench("merge_compare", ("bench/merge_compare.py", "--out", "out/results/merge_compare"),
          "issue 34's side by side: every command recorded before the one-engine merge (bench/results/premerge/, "
          "3 seeds) rerun on this tree, each value paired with its old one",
          fresh=("out/results/merge_compare",)),
    Bench("ttft_parts", ("bench/ttft_parts.py", "--point", "fig12-conv", "--physics", "paper", "--servers", "64",
                         "--requests", "384", "--warmup", "128", "--seeds", "3", "--policies", "fs,mfs,karuna-group",
                         "--jobs", "2"),
          "where TTFT goes (queue, compute, P2D tail) per flow policy at Fig. 12a under the paper's physics"),
    Bench("codesign", ("bench/codesign.py", "--presets", "fig12-conv,fig12-agent", "--physics", "faithful,paper",
                       "--slo-scales", "1.5,2,3", "--loads", "0.8,1.0,1.2", *CLAIMS_SCALE,
                       "--out", "out/results/codesign"),
          "MFS pruning feeding FlowPrefill's deferral: MFS, FlowPrefill, both blind and both coupled, where MFS prunes; "
          "TPOT per combination",
          fresh=("out/results/codesign",)),
    Bench("instance_policies", ("bench/instance_policies.py", "--seeds", "5", "--requests", "600", "--warmup", "100",
                                "--jobs", "2", "--out", "out/results/instance_policies"),
          "flow policies on the instance engine: P2D under contention (TTFT, TPOT) and Arrow's pools, network on",
          fresh=("out/results/instance_policies",)),
    Bench("sim_map", ("bench/sim_map.py", "--out", "out/results/sim_map", "--plot", "docs/results/map", "--jobs", "2"),
          "laxflow sim map at its defaults (star grid, Mixtral-8x22B and DBRX, 3 seeds): where MFS pays",
          fresh=("out/results/sim_map",)),
    Bench("workload_calibration", ("bench/workload_calibration.py",),
          "the synthetic workloads' mean prompt length and prefix reuse against their targets"),
    Bench("flowprefill_goodput", ("bench/flowprefill.py", "goodput", "--model", "llama3-8b", "--seeds", "3",
                                  "--requests", "200", "--warmup", "50"),
          "FlowPrefill Fig. 9: goodput at 90 % attainment per prefill scheduler, Llama3-8B 1P1D"),
    Bench("flowprefill_slo", ("bench/flowprefill.py", "slo-scale", "--model", "llama3-8b", "--rate", "2.9",
                              "--seeds", "3", "--requests", "200", "--warmup", "50"),
          "FlowPrefill Fig. 9: tightest SLO scale at 2.9 req/s per prefill scheduler, Llama3-8B 1P1D"),
    Bench("flowprefill_coupling", ("bench/flowprefill_coupling.py", "--preset", "flowprefill-llama3-8b",
                                   "--rates", "1,2,3,4,5,6,7,8", "--seeds", "3"),
          "MFS and FlowPrefill together: goodput of each alone and both"),
    Bench("preemption", ("bench/preemption.py", "--json"),
          "FlowPrefill §6.4: preemption blocking time, operator- vs layer-level checks (CPU engine)"),
    Bench("fairbatching", ("bench/batching_repro.py", "--only", "fb_single,fb_cluster", "--seeds", "3", "--jobs", "1",
                           "--requests", "100", "--warmup", "20"),
          "FairBatching §5.2-5.5 on the instance engine"),
    Bench("proserve", ("bench/batching_repro.py", "--only", "ps_single,ps_coloc,ps_disagg", "--seeds", "3",
                       "--jobs", "1", "--requests", "100", "--warmup", "20"),
          "ProServe §5.2-5.3 on the instance engine"),
    Bench("arrow", ("bench/arrow_repro.py", "--json", "--seeds", "3", "--requests", "500", "--bisect", "1",
                    "--scaling", ""),
          "Arrow §7.2-7.4: sustainable rate at 90 % attainment, Azure Code, 8 instances"),
    Bench("testbed_ratio", ("bench/testbed_ratio.py", "--runs", "8", "--json"),
          "MFS on the emulated fabric: CCT and TTFT ratios off/on over repeated testbed runs", needs_root=True),
    Bench("testbed_fidelity", ("bench/testbed_fidelity.py", "--requests", "20", "--repeat", "3", "--json"),
          "simulator model vs testbed measurement of the contention scenario", needs_root=True),
    # Component benchmarks (docs/results/benchmarks.md, bench/README.md).
    Bench("shim", ("bench/shim.py", "--json"), "native shim overhead and shared-memory ring throughput"),
    Bench("control_plane", ("bench/control_plane.py", "--json", "--only", "inter", "--only", "permit", "--only",
                            "events", "--only", "hooks"),
          "coordinator decision time, daemon permit latency and event rate, hooks calls"),
    # Apart: under heavy load the daemon's heartbeat goes stale, the gate fails open and this section
    # refuses to time it (RuntimeError), which must not cost the other sections' figures.
    Bench("control_plane_idle", ("bench/control_plane.py", "--json", "--only", "idle"),
          "submit-to-run latency of a message after idleness (PermitGate submit and acquire)"),
    Bench("policy", ("bench/policy.py", "--json"), "MFS policy core and Algorithm 1 speed"),
    Bench("network", ("bench/network.py", "--json"), "flow-level network engine speed"),
    Bench("sim", ("bench/sim.py", "--json"), "serving simulator at paper scale and as the cluster grows"),
    Bench("mooncake_adapter", ("bench/mooncake_adapter.py", "--json"), "what the Mooncake wrapper adds to a transfer"),
    Bench("batch_policies", ("bench/batch_policies.py", "--json"),
          "per-decision cost of the batch schedulers, routers and pool managers"),
    Bench("soak", ("bench/soak.py", "--minutes", "2", "--json"),
          "loopback cluster soak with -9 kills and restarts"),
)}
