"""Network and compute scheduled together: goodput of MFS alone, FlowPrefill alone and both, as JSON.

    python bench/flowprefill_coupling.py --preset fig12-conv --servers 4 --rates 0.2,0.4,0.6 --seeds 2
    python bench/flowprefill_coupling.py --preset flowprefill-llama3-8b --rates 2,4,6,8 --seeds 3

Combinations (each a serving simulation of the preset on the same requests):
``mfs`` and ``mfs-prune`` (MFS alone: the MFS paper's run-to-completion FCFS
batch former), ``flowprefill+fs`` (FlowPrefill alone), ``flowprefill+mfs`` and
``flowprefill+mfs-prune`` (together: the flow policy's pruned set reaches the
prefill scheduler, which defers pruned tasks). ``mfs-prune`` is ``mfs`` with
Algorithm 1's pruning on when it runs without a coordinator (``drop_budget``
1, ``prefill_driver.MfsPruning``); plain ``mfs`` alone never prunes in the
simulator. Goodput: the largest swept rate (requests/s per prefill GPU) with
>= 90 % SLO attainment, per seed, then the mean. Also per run: how many
requests MFS pruned and how many tasks the prefill units deferred.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace

PRUNING = "laxflow.sim.serving.prefill_driver:MfsPruning"
COMBOS = {  # name -> (prefill scheduler or None for the legacy batch former, flow policy)
    "mfs": (None, "mfs"),
    "mfs-prune": (None, PRUNING),
    "flowprefill+fs": ("flowprefill", "fs"),
    "flowprefill+mfs": ("flowprefill", "mfs"),
    "flowprefill+mfs-prune": ("flowprefill", PRUNING),
}


def run(config, workload: str, rate: float, prefill, policy: str, requests: int, seed: int) -> dict:
    from laxflow.policy.base import pruned_count
    from laxflow.sim.serving.experiment import RunSpec, build_workload
    from laxflow.sim.serving.metrics import summarize
    from laxflow.sim.serving.simulator import ServingSimulator

    cfg = replace(config, prefill=prefill)
    spec = RunSpec(cfg, workload, rate, policy, requests, seed, prefill=prefill)
    sim = ServingSimulator(cfg, build_workload(spec), policy)
    row = summarize(sim.run(), rate)
    return {"attainment": round(float(row["slo_attainment"]), 4), "pruned": pruned_count(sim.policy) or 0,
            "deferrals": sum(d.deferrals for d in sim.drivers) if sim.drivers else 0}


def main(argv: list[str] | None = None) -> int:
    from laxflow.sim.serving.experiment import get_preset

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="fig12-conv")
    ap.add_argument("--rates", required=True, help="comma-separated requests/s per prefill GPU")
    ap.add_argument("--servers", type=int, default=None)
    ap.add_argument("--nic-gbps", type=float, default=None, help="per-NIC bandwidth (default: the deployment's)")
    ap.add_argument("--dispatch", default="ttft", choices=("load", "ttft"))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--combos", default=",".join(COMBOS))
    a = ap.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",")]
    combos = [c.strip() for c in a.combos.split(",") if c.strip()]
    for c in combos:
        if c not in COMBOS:
            ap.error(f"--combos: unknown {c!r} (expected some of {', '.join(COMBOS)})")
    preset = get_preset(a.preset)
    config = replace(preset.config(), warmup=a.warmup, router_dispatch=a.dispatch)
    cluster = config.cluster
    if a.servers:
        cluster = replace(cluster, servers=a.servers)
    if a.nic_gbps:
        cluster = replace(cluster, nic_gbps=a.nic_gbps)
    config = replace(config, cluster=cluster)
    t0 = time.perf_counter()
    runs: dict[str, list[dict]] = {c: [] for c in combos}
    for c in combos:
        prefill, policy = COMBOS[c]
        for seed in range(a.seeds):
            for rate in rates:
                r = run(config, preset.workload, rate, prefill, policy, a.requests, seed)
                runs[c].append({"rate": rate, "seed": seed, **r})
                print(f"{c} seed {seed} rate {rate}: {r}", file=sys.stderr)
    good: dict[str, list] = {}
    for c, rows in runs.items():
        good[c] = []
        for seed in range(a.seeds):
            held = [r["rate"] for r in rows if r["seed"] == seed and r["attainment"] >= 0.9]
            good[c].append(max(held) if held else None)
    mean = {c: (None if None in v else statistics.fmean(v)) for c, v in good.items()}
    out = {"preset": a.preset, "workload": preset.workload, "model": config.model, "servers": cluster.servers,
           "nic_gbps": a.nic_gbps, "dispatch": a.dispatch, "requests": a.requests, "warmup": a.warmup,
           "rates": rates, "rate_unit": "requests/s per prefill GPU", "goodput_seeds": good, "goodput": mean,
           "runs": runs}
    alone = [mean[c] for c in ("mfs", "mfs-prune", "flowprefill+fs") if mean.get(c)]
    together = [mean[c] for c in ("flowprefill+mfs", "flowprefill+mfs-prune") if mean.get(c)]
    if alone and together:
        out["together_over_best_alone"] = round(max(together) / max(alone), 3)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
