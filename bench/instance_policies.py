"""Flow policies on the instance engine: P2D under contention, and Arrow's pools with the network on.

    python bench/instance_policies.py --seeds 5 --requests 600 --warmup 100 --jobs 2 --out out/instance_policies

Two of issue 34's experiments, on the iteration-level engine (decode steps, KV memory, TPOT), where the
only network traffic is the prefill-to-decode KV (stage 3): each prompt's KV is one flow from its prefill
instance's port to its decode instance's (``instances/fabric.py``: one port per instance of NIC x GPUs
bytes/s on a non-blocking switch) under the flow policy, and a request's first token is seen when that KV
has landed. Llama3-8B TP1 on A800s (the Arrow and FairBatching deployment), sarathi batches.

* ``p2d``: azure-conv (Splitwise's conversation lengths; Arrow Table 1's SLO, 2 s TTFT, 150 ms TPOT)
  on 8 instances, 6 prefill : 2 decode (dplb router): six senders share two receivers' ports, so at a low
  NIC bandwidth P2D is the bottleneck. NIC per GPU ``--nics`` (200: the deployment's; 25), rates
  ``--p2d-rates`` (requests/s per instance).
* ``arrow``: the ``arrow-azure-code`` preset's cluster (8 instances, bursty azure-code, SLO 3 s /
  100 ms) under the pool managers ``arrow`` and ``static-pd``, NIC ``--arrow-nics``, rates
  ``--arrow-rates``.

Policies: ``fs``, ``mfs`` (``drop_budget`` 0: alone it prunes nothing, as the daemon without a
coordinator), ``mfs-prune`` (``prefill_driver.MfsPruning``: Algorithm 1 with a budget of 1 per run, the
coordinator's pruning done by the policy), and on ``p2d`` also ``sjf`` and ``edf``. Every policy of a
seed runs the same requests. One JSON line per point: per policy the mean over seeds (and 95 %
half-width) of SLO, TTFT and TPOT attainment, mean and p90 TTFT and TPOT, pruned requests; then the
paired differences against ``fs`` (per seed, same requests) of TTFT attainment and mean TPOT, with
their intervals and whether they exclude 0. Runs are logged to ``OUT/runs.jsonl`` as they finish and a
rerun resumes (``_campaign.py``). Not a test: only wall time depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from _campaign import positive_floats, run_campaign
from laxflow.sim.map.figures import mean_ci, paired_diff
from laxflow.sim.serving.experiment import PRESETS, RunSpec

PRUNING = "laxflow.sim.serving.prefill_driver:MfsPruning"
NAMES = {"fs": "fs", "mfs": "mfs", "mfs-prune": PRUNING, "sjf": "sjf", "edf": "edf"}
POLICIES = {"p2d": ("fs", "mfs", "mfs-prune", "sjf", "edf"), "arrow": ("fs", "mfs", "mfs-prune")}
KEYS = ("slo_attainment", "ttft_attainment", "tpot_attainment", "ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90",
        "pruned", "preemptions", "wall_s")


def points(a: argparse.Namespace) -> list[tuple]:
    """(experiment, manager: instances "P:D" or a pool manager, NIC Gbit/s, rate per instance)."""
    p2d_rates = positive_floats(a.p2d_rates, "--p2d-rates")
    arrow_rates = positive_floats(a.arrow_rates, "--arrow-rates")
    out = [("p2d", "6:2", nic, rate) for nic in positive_floats(a.nics, "--nics") for rate in p2d_rates]
    out += [("arrow", pools, nic, rate) for pools in a.pools.split(",")
            for nic in positive_floats(a.arrow_nics, "--arrow-nics") for rate in arrow_rates]
    return [p for p in out if p[0] in a.only.split(",")]


def point_specs(point: tuple, seed: int, a: argparse.Namespace) -> dict[str, RunSpec]:
    experiment, manager, nic, rate = point
    preset = PRESETS["arrow-azure-code"]  # its deployment and engine settings; p2d changes the workload
    cfg = preset.config()
    cfg = replace(cfg, cluster=replace(cfg.cluster, nic_gbps=nic), warmup=a.warmup)
    if experiment == "p2d":
        common = dict(prefill="sarathi", router="dplb", instances=manager)
        workload = "azure-conv"
    else:
        common = dict(prefill=preset.extra["prefill"], pools=manager, instances=preset.extra["instances"])
        workload = preset.workload
    return {p: RunSpec(cfg, workload, rate, NAMES[p], a.requests, seed, **common) for p in POLICIES[experiment]}


def _paired(a: list[float], b: list[float], digits: int) -> dict:
    mean, half, excludes = paired_diff(a, b)
    return {"mean": round(mean, digits), "ci95": round(half or 0.0, digits), "excludes_0": excludes}


def summary(point: tuple, done: dict, seeds: list[int], a: argparse.Namespace) -> dict:
    experiment, manager, nic, rate = point
    line: dict = {"experiment": experiment, "manager": manager, "nic_gbps": nic, "rate": rate,
                  "workload": "azure-conv" if experiment == "p2d" else "azure-code", "requests": a.requests,
                  "warmup": a.warmup, "seeds": len(seeds), "policies": {}}
    if not seeds:
        return line
    rows = {p: [done[(point, s, p)] for s in seeds] for p in POLICIES[experiment]}
    for p, mine in rows.items():
        cell: dict = {}
        for k in KEYS[:-1]:
            mean, half = mean_ci([float(r[k] or 0.0) for r in mine])
            cell[k] = round(mean, 4)
            if k.endswith("attainment"):
                cell[k + "_ci95"] = round(half or 0.0, 4)
        cell["slo_attainment_seeds"] = [round(r["slo_attainment"], 4) for r in mine]
        line["policies"][p] = cell
    fs = rows["fs"]
    line["paired_vs_fs"] = {p: {"ttft_attainment": _paired([r["ttft_attainment"] for r in rows[p]],
                                                           [r["ttft_attainment"] for r in fs], 4),
                                "tpot_mean_ms": _paired([r["tpot_mean"] * 1e3 for r in rows[p]],
                                                        [r["tpot_mean"] * 1e3 for r in fs], 3)}
                            for p in rows if p != "fs"}
    line["wall_s"] = round(sum(r["wall_s"] for mine in rows.values() for r in mine), 1)
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="p2d,arrow", help="experiments: p2d, arrow")
    ap.add_argument("--nics", default="200,25", help="p2d: NIC Gbit/s per GPU")
    ap.add_argument("--p2d-rates", default="1.5,2.5,3.0", help="p2d: requests/s per instance")
    ap.add_argument("--pools", default="arrow,static-pd", help="arrow: pool managers")
    ap.add_argument("--arrow-nics", default="200,50")
    ap.add_argument("--arrow-rates", default="1.0,2.0")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="out/instance_policies")
    a = ap.parse_args(argv)
    unknown = set(a.only.split(",")) - set(POLICIES)
    if unknown:
        ap.error(f"--only: unknown {', '.join(sorted(unknown))} (expected p2d, arrow)")
    todo = points(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def todo_for(seed: int) -> list[tuple[tuple, RunSpec]]:
        return [((pt, seed, p), spec) for pt in todo for p, spec in point_specs(pt, seed, a).items()]

    def record(key: tuple, spec: RunSpec, row: dict) -> dict:
        pt, seed, p = key
        return {**{k: row.get(k) for k in KEYS}, "point": list(pt), "seed": seed, "policy": p}

    done = run_campaign(out / "runs.jsonl", range(a.seeds), todo_for, record,
                        lambda r: (tuple(r["point"]), r["seed"], r["policy"]), a.jobs)
    for pt in todo:
        seeds = sorted({s for (q, s, _) in done if q == pt and all((pt, s, p) in done for p in POLICIES[pt[0]])})
        print(json.dumps(summary(pt, done, seeds, a)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
