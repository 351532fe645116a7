"""Run the MFS-paper presets and print the numbers of the README's paper-vs-ours table.

    python bench/sim_paper.py --servers 32 --requests 300 --warmup 100 --jobs 2 --out out/paper

For every preset (or those named with --presets) it runs all its policies at
the rates picked by --points (indices into the preset's rates; default: the
middle and the highest load), on the same workload per rate, writes one JSON
per preset under --out and prints one JSON line per (preset, rate) with:
SLO attainment per policy, MFS over the best baseline, and MFS's change
against FS in mean TTFT, CCT and non-negative earliness (the Fig. 9 and
Fig. 13 metrics). Flags override the presets' cluster size and request
counts, so the table can be made at reduced scale on a small machine; the
README says which scale each number comes from.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from laxflow.sim.map.figures import BASELINES
from laxflow.sim.serving.experiment import PRESETS, RunSpec, rates_at, run_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=",".join(p for p in PRESETS if p != "demo"))
    ap.add_argument("--servers", type=int, default=None, help="shrink the presets' clusters to this many servers (paper: 256)")
    ap.add_argument("--requests", type=int, default=None, help="measured requests (paper: 1024)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up requests (paper: 512)")
    ap.add_argument("--points", default="mid,high", help="which preset rates: low, mid, high, all")
    ap.add_argument("--fractions", default=None,
                    help="instead of --points: these fractions of the preset's capacity (figure presets only)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="out/paper")
    args = ap.parse_args()

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.presets.split(","):
        preset = PRESETS[name]
        rates = list(preset.rates)
        picks = {"low": [rates[0]], "mid": [rates[len(rates) // 2]], "high": [rates[-1]], "all": rates}
        chosen = sorted({r for p in args.points.split(",") for r in picks[p]})
        if args.fractions:
            chosen = list(rates_at(preset.model, preset.workload, tuple(float(f) for f in args.fractions.split(","))))
        cfg = preset.config()
        servers = min(args.servers, preset.servers) if args.servers else preset.servers  # never grow the testbed
        cfg = replace(cfg, cluster=replace(cfg.cluster, servers=servers),
                      warmup=preset.warmup if args.warmup is None else args.warmup)
        n = args.requests or preset.requests
        specs = [RunSpec(cfg, preset.workload, r, p, n, preset.seed) for r in chosen for p in preset.policies]
        t0 = time.perf_counter()
        rows = run_all(specs, jobs=args.jobs)
        for row in rows:
            row.pop("ttft_samples", None)
            row.pop("slo_samples", None)
        (out_dir / f"{name}.json").write_text(json.dumps({"preset": name, "servers": cfg.cluster.servers,
                                                          "requests": n, "warmup": cfg.warmup, "rows": rows},
                                                         indent=1))
        for rate in chosen:
            at = {r["policy"]: r for r in rows if r["rate"] == rate}
            line = {"preset": name, "rate": rate, "servers": cfg.cluster.servers, "requests": n,
                    "attainment": {p: round(r["slo_attainment"], 3) for p, r in at.items()}}
            if "mfs" in at:
                base = [at[b]["slo_attainment"] for b in BASELINES if b in at]
                if base:
                    best = max(base)
                    line["mfs_over_best_baseline"] = round(at["mfs"]["slo_attainment"] / best, 3) if best else None
                if "fs" in at:
                    fs, mfs = at["fs"], at["mfs"]
                    line["ttft_mean_change_vs_fs"] = round(mfs["ttft_mean"] / fs["ttft_mean"] - 1, 3)
                    line["cct_change_vs_fs"] = round(mfs["cct_mean"] / fs["cct_mean"] - 1, 3) if fs["cct_mean"] else None
                    e_fs, e_m = fs["earliness_nonneg_mean"], mfs["earliness_nonneg_mean"]
                    line["nonneg_earliness_change_vs_fs"] = round(e_m / e_fs - 1, 3) if e_fs else None
            line["wall_s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(line), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
