"""The README's "paper's claims and ours" table: presets x seeds x policies, with 95 % intervals.

    python bench/sim_claims.py --points fig10-mixtral,fig11-mixtral@1.6 --fraction 0.8 --seeds 5 \
        --servers 16 --requests 200 --warmup 100 --jobs 2 --out runs/claims

A point is ``preset@rate`` (requests/s per prefill GPU) or a bare ``preset``,
whose rate is ``--fraction`` (or each of ``--fractions``) of its model's capacity on its workload
(``experiment.CAPACITY``, the presets' own normalization; with ``--physics
paper`` the capacity under the MFS paper's physics, ``experiment.rates_at``; ``--physics`` takes a
comma-separated list, each point runs under each). Every policy of
the preset runs on seeds 0 .. N-1 (the same requests for every policy of a
seed); runs are ordered seed by seed over all points, so a cut-short
campaign has the same seeds at every point. Each finished run is appended
to ``OUT/runs.jsonl`` at once and a rerun skips the runs already there
(``--summary`` only reads them). Then one JSON line per point: per policy
the mean SLO attainment over the seeds and the half-width of its 95 %
confidence interval (Student t, N - 1 degrees of freedom), mean TTFT, CCT,
CCT inflation (CCT over the same layers' CCT on an idle fabric), realized
and remote reuse shares and the network's byte shares per stage; MFS over
the best baseline (highest mean), and whether that margin is a tie (inside
MFS's and the best baseline's intervals); and the paired difference (MFS
minus the best baseline per seed, on the same requests) with its interval, and the same against each baseline
that ran (``paired_vs``). ``--policies`` runs that list instead of each preset's; with ``sjf-group`` and
``karuna-group`` (SJF and Karuna sizing a collective as one job) the line also has ``group_baselines``: MFS
over the best of fs, edf, sjf-group and karuna-group, and its paired difference. Not a test: numbers depend on the
machine only through wall time, which it reports.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from _campaign import run_campaign
from laxflow.sim.map.figures import GROUP_BASELINES, mean_ci, paired_diff, paired_margin
from laxflow.sim.serving.experiment import PRESETS, RunSpec, rates_at
from laxflow.stage import STAGE_NAMES

COST = {"mfs": 3, "karuna": 2}  # rough relative run time, to start the slowest runs first


def expand(args: argparse.Namespace) -> list[tuple[str, str, float | None]]:
    """Every (point, physics, fraction) to run: a bare preset at each ``--fractions``, ``preset@rate`` once,
    each under every ``--physics``."""
    fractions = [float(f) for f in (args.fractions or str(args.fraction)).split(",")]
    out = []
    for physics in args.physics.split(","):
        for pt in args.points.split(","):
            out += [(pt, physics, None)] if "@" in pt else [(pt, physics, f) for f in fractions]
    return out


def point_specs(item: tuple[str, str, float | None], args: argparse.Namespace, seed: int) -> tuple[str, list[RunSpec]]:
    """The point's key (``preset@rate``, with ``|physics`` unless faithful) and its runs on one seed."""
    point, physics, fraction = item
    name, _, rate = point.partition("@")
    preset = PRESETS[name]
    cfg = preset.config().with_physics(physics)
    if not rate:
        rate = str(rates_at(cfg.model, preset.workload, (fraction,), physics)[0])
    servers = min(args.servers, preset.servers) if args.servers else preset.servers
    cfg = replace(cfg, cluster=replace(cfg.cluster, servers=servers),
                  warmup=preset.warmup if args.warmup is None else args.warmup)
    if args.kv_placement:
        cfg = replace(cfg, kv_placement=args.kv_placement)
    cfg = replace(cfg, decode=args.decode)
    n = args.requests or preset.requests
    key = (f"{name}@{float(rate)}" + ("" if cfg.physics == "faithful" else f"|{cfg.physics}")
           + ("" if args.decode == "hold" else f"|decode={args.decode}"))
    policies = args.policies.split(",") if args.policies else preset.policies
    return key, [RunSpec(cfg, preset.workload, float(rate), p, n, seed) for p in policies]


def summary(key: str, rows: list[dict], specs: list[RunSpec], fraction: float | None = None) -> dict:
    """One point's JSON line from its runs (every seed that has all policies)."""
    name, _, rate = key.split("|")[0].partition("@")
    spec = specs[0]
    policies = [s.policy for s in specs]
    by_seed: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {})[r["policy"]] = r
    seeds = sorted(s for s, got in by_seed.items() if all(p in got for p in policies))
    line: dict = {"preset": name, "rate": float(rate), "servers": spec.config.cluster.servers,
                  "requests": spec.requests, "warmup": spec.config.warmup, "seeds": len(seeds),
                  "kv_placement": spec.config.kv_placement, "physics": spec.config.physics, "fraction": fraction,
                  "decode": spec.config.decode,
                  "policies": {}}
    if not seeds:
        return line
    for p in policies:
        mine = [by_seed[s][p] for s in seeds]
        att, ci = mean_ci([r["slo_attainment"] for r in mine])
        ci = ci or 0.0
        net = {k: sum(r["network_bytes_by_stage"].get(k, 0.0) for r in mine) for k in STAGE_NAMES}
        total = sum(net.values()) or 1.0
        line["policies"][p] = {
            "slo_attainment": round(att, 3), "slo_attainment_ci95": round(ci, 3),
            "slo_attainment_seeds": [round(r["slo_attainment"], 3) for r in mine],
            "ttft_mean": round(mean_ci([r["ttft_mean"] for r in mine])[0], 4),
            "slo_mean": round(mean_ci([r["slo_mean"] for r in mine])[0], 4),
            "cct_mean": round(mean_ci([r["cct_mean"] for r in mine])[0], 6),
            "cct_inflation": round(mean_ci([r["cct_inflation"] for r in mine])[0], 3),
            "nonneg_earliness": round(mean_ci([r["earliness_nonneg_mean"] for r in mine])[0], 4),
            "reuse_share": round(mean_ci([r["reuse_share"] for r in mine])[0], 3),
            "remote_reuse_share": round(mean_ci([r["remote_reuse_share"] for r in mine])[0], 3),
            "byte_share": {k: round(v / total, 3) for k, v in net.items()},
        }
        if all(r.get("tpot_mean") is not None for r in mine):  # --decode steps
            line["policies"][p]["tpot_mean"] = round(mean_ci([r["tpot_mean"] for r in mine])[0], 6)
    pol = line["policies"]
    margin = paired_margin(by_seed, seeds)
    if margin is not None:
        best, d, dci, excludes = margin
        m, b = pol["mfs"], pol[best]
        line["best_baseline"] = best
        line["mfs_over_best"] = round(m["slo_attainment"] / b["slo_attainment"], 3) if b["slo_attainment"] else None
        line["mfs_minus_best"] = round(m["slo_attainment"] - b["slo_attainment"], 3)
        line["tie"] = abs(m["slo_attainment"] - b["slo_attainment"]) <= m["slo_attainment_ci95"] + b["slo_attainment_ci95"]
        # Paired view: every policy of a seed runs the same requests, so the per-seed difference
        # has far less spread than either attainment; its interval excluding 0 means a real margin.
        line["paired_diff"] = {"mean": round(d, 3), "ci95": round(dci or 0.0, 3), "excludes_0": excludes}
        line["paired_vs"] = {}  # MFS minus each baseline that ran, per seed
        for p in pol:
            if p != "mfs":
                pd, pci, pex = paired_diff([by_seed[s]["mfs"]["slo_attainment"] for s in seeds],
                                           [by_seed[s][p]["slo_attainment"] for s in seeds])
                line["paired_vs"][p] = {"mean": round(pd, 3), "ci95": round(pci or 0.0, 3), "excludes_0": pex}
        group = paired_margin(by_seed, seeds, GROUP_BASELINES)
        if {"sjf-group", "karuna-group"} <= set(pol) and group is not None:
            # The same margin with SJF and Karuna sizing a collective as one job (the paper does not say which).
            gbest, gd, gci, gex = group
            g = pol[gbest]["slo_attainment"]
            line["group_baselines"] = {"best_baseline": gbest,
                                       "mfs_over_best": round(m["slo_attainment"] / g, 3) if g else None,
                                       "paired_diff": {"mean": round(gd, 3), "ci95": round(gci or 0.0, 3),
                                                       "excludes_0": gex}}
        if "fs" in pol:
            fs = pol["fs"]
            line["mfs_vs_fs"] = {k: round(m[k] / fs[k] - 1.0, 3) if fs[k] else None
                                 for k in ("ttft_mean", "cct_mean", "nonneg_earliness")}
    line["wall_s"] = round(sum(r["wall_s"] for s in seeds for r in by_seed[s].values()), 1)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", required=True, help="comma-separated preset or preset@rate")
    ap.add_argument("--fraction", type=float, default=0.8, help="a bare preset's rate, as a fraction of capacity")
    ap.add_argument("--fractions", default=None, help="comma-separated fractions instead (a load sweep)")
    ap.add_argument("--policies", default=None,
                    help="comma-separated flow policies instead of each preset's (with mfs: its margin over the others)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--servers", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--kv-placement", default=None)
    ap.add_argument("--physics", default="faithful",
                    help="comma-separated: faithful, paper, or field=value;... over faithful (one choice at a time: "
                    "config.parse_physics); a bare preset's rate is a fraction of the capacity under each")
    ap.add_argument("--decode", default="steps", choices=("hold", "steps"),
                    help="the decode units' model (ServingConfig.decode): steps, decode batches (the default; each "
                         "point's key gets |decode=steps), or hold, a decode unit held output tokens x 30 ms (the "
                         "keys of runs recorded before decode batches)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="out/claims")
    ap.add_argument("--summary", action="store_true", help="only summarize the runs already in OUT/runs.jsonl")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    points = expand(args)
    keys = {pt: point_specs(pt, args, 0)[0] for pt in points}

    def todo_for(seed: int) -> list[tuple[tuple[str, int, str], RunSpec]]:
        return [((keys[pt], seed, s.policy), s) for pt in points for s in point_specs(pt, args, seed)[1]]

    def record(key: tuple[str, int, str], spec: RunSpec, row: dict) -> dict:
        return {**{k: v for k, v in row.items() if k not in ("ttft_samples", "slo_samples")}, "point": key[0]}

    done = run_campaign(out / "runs.jsonl", [] if args.summary else range(args.seeds), todo_for, record,
                        lambda r: (r["point"], r["seed"], r["policy"]), args.jobs,
                        cost=lambda s: COST.get(s.policy, 0))
    for pt in points:
        key, specs = point_specs(pt, args, 0)
        rows = [r for (k, _, _), r in done.items() if k == key]
        print(json.dumps(summary(key, rows, specs, pt[2])), flush=True)


if __name__ == "__main__":
    main()
