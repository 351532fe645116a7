"""The README's "paper's claims and ours" table: presets x seeds x policies, with 95 % intervals.

    python bench/sim_claims.py --points fig10-mixtral@0.6,fig13@0.7 --seeds 5 --servers 32 \
        --requests 300 --warmup 100 --jobs 2 --out out/claims

For every ``preset@rate`` it runs every policy of the preset on seeds 0 ..
N-1 (the same requests for every policy of a seed), and prints one JSON line:
per policy the mean SLO attainment over the seeds and the half-width of its
95 % confidence interval (Student t, N - 1 degrees of freedom), mean TTFT,
CCT and CCT inflation (CCT over the same layers' CCT on an idle fabric);
MFS over the best baseline, and whether that margin is a tie (MFS's and the
best baseline's intervals overlap); the network's byte shares per stage, the
realized reuse share and the remote-reuse share (under FS). Not a test:
numbers depend on the machine only through wall time, which it reports.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

from laxflow.sim.serving.experiment import PRESETS, RunSpec, run_all

BASELINES = ("fs", "sjf", "edf", "karuna")
# Two-sided 95 % Student t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % half-width (0 for one value)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, 0.0
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", required=True, help="comma-separated preset@rate (rate: requests/s per prefill GPU)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--servers", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--kv-placement", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="out/claims")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for point in args.points.split(","):
        name, rate = point.split("@")
        preset = PRESETS[name]
        cfg = preset.config()
        servers = min(args.servers, preset.servers) if args.servers else preset.servers
        cfg = replace(cfg, cluster=replace(cfg.cluster, servers=servers),
                      warmup=preset.warmup if args.warmup is None else args.warmup)
        if args.kv_placement:
            cfg = replace(cfg, kv_placement=args.kv_placement)
        n = args.requests or preset.requests
        specs = [RunSpec(cfg, preset.workload, float(rate), p, n, seed)
                 for seed in range(args.seeds) for p in preset.policies]
        t0 = time.perf_counter()
        rows = run_all(specs, jobs=args.jobs)
        for row, spec in zip(rows, specs):
            row.pop("ttft_samples", None)
            row.pop("slo_samples", None)
            row["seed"] = spec.seed
        (out / f"{name}@{rate}.json").write_text(json.dumps(rows, indent=1))
        line: dict = {"preset": name, "rate": float(rate), "servers": servers, "requests": n, "warmup": cfg.warmup,
                      "seeds": args.seeds, "kv_placement": cfg.kv_placement, "policies": {}}
        for p in preset.policies:
            mine = [r for r in rows if r["policy"] == p]
            att, ci = mean_ci([r["slo_attainment"] for r in mine])
            line["policies"][p] = {
                "slo_attainment": round(att, 3), "slo_attainment_ci95": round(ci, 3),
                "ttft_mean": round(mean_ci([r["ttft_mean"] for r in mine])[0], 4),
                "cct_mean": round(mean_ci([r["cct_mean"] for r in mine])[0], 6),
                "cct_inflation": round(mean_ci([r["cct_inflation"] for r in mine])[0], 3),
                "nonneg_earliness": round(mean_ci([r["earliness_nonneg_mean"] for r in mine])[0], 4),
            }
        pol = line["policies"]
        if "mfs" in pol:
            best = max((b for b in BASELINES if b in pol), key=lambda b: pol[b]["slo_attainment"])
            m, b = pol["mfs"], pol[best]
            line["best_baseline"] = best
            line["mfs_over_best"] = round(m["slo_attainment"] / b["slo_attainment"], 3) if b["slo_attainment"] else None
            gap = abs(m["slo_attainment"] - b["slo_attainment"])
            line["tie"] = gap <= m["slo_attainment_ci95"] + b["slo_attainment_ci95"]
        fs = [r for r in rows if r["policy"] == "fs"]
        net = {k: sum(r["network_bytes_by_stage"].get(k, 0.0) for r in fs) for k in ("reuse", "collective", "p2d")}
        total = sum(net.values()) or 1.0
        line["byte_share_fs"] = {k: round(v / total, 3) for k, v in net.items()}
        line["remote_reuse_share_fs"] = round(mean_ci([r["remote_reuse_share"] for r in fs])[0], 3)
        line["reuse_share_fs"] = round(mean_ci([r["reuse_share"] for r in fs])[0], 3)
        line["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
