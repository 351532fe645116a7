"""FlowPrefill Figure 9 in the simulator: goodput and the tightest SLO scale per prefill scheduler, as JSON.

    python bench/flowprefill.py goodput --model llama3-8b --seeds 3
    python bench/flowprefill.py slo-scale --model llama3-8b --rate 4 --seeds 3

Each metric is searched per seed (laxflow.sim.serving.flowprefill_eval:
geometric scan from --start, then bisection to --tol; a scheduler's later
seeds start where its previous seed ended), on the 1P1D preset
``flowprefill-<model>`` (qwen-multislo, Table 2 SLOs). Prints one JSON
object: per scheduler the per-seed values and their mean, the ratios of
``flowprefill`` over each baseline (goodput: flowprefill / baseline; SLO
scale: baseline / flowprefill, "x tighter"), and every probe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from laxflow.sim.serving import flowprefill_eval as fe

SCHEDULERS = "flowprefill,fcfs,edf-cp2k,edf-cp8k"


def _mean(values: list[float | None]) -> float | None:
    return None if not values or None in values else float(statistics.fmean(values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metric", choices=("goodput", "slo-scale"))
    ap.add_argument("--model", default="llama3-8b", choices=("llama3-8b", "qwen2.5-14b", "llama3-70b"))
    ap.add_argument("--schedulers", default=SCHEDULERS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=400, help="measured requests per run")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--start", type=float, default=None,
                    help="first probe: instance req/s (goodput, default 1) or SLO scale (slo-scale, default 1)")
    ap.add_argument("--rate", type=float, default=None, help="slo-scale: the fixed instance rate (req/s)")
    ap.add_argument("--slo-scale", type=float, default=1.0, help="goodput: the SLO scale (Table 2 x this)")
    ap.add_argument("--tol", type=float, default=0.03, help="relative width the bisection stops at")
    a = ap.parse_args(argv)
    if a.metric == "slo-scale" and not (a.rate and a.rate > 0):
        ap.error("slo-scale needs --rate (instance requests/s, > 0)")
    if a.seeds < 1 or a.requests < 1 or a.warmup < 0:
        ap.error("--seeds and --requests must be >= 1, --warmup >= 0")
    names = [n.strip() for n in a.schedulers.split(",") if n.strip()]
    t0 = time.perf_counter()
    out: dict = {"metric": a.metric, "model": a.model, "preset": f"flowprefill-{a.model}", "requests": a.requests,
                 "warmup": a.warmup, "seeds": list(range(a.seeds)), "tol": a.tol, "threshold": fe.THRESHOLD,
                 "unit": "instance requests/s" if a.metric == "goodput" else "SLO scale (x Table 2)",
                 "values": {}, "mean": {}, "probes": {}}
    if a.metric == "goodput":
        out["slo_scale"] = a.slo_scale
    else:
        out["rate"] = a.rate
    for name in names:
        vals, probes = [], []
        start = a.start or 1.0
        for seed in range(a.seeds):
            if a.metric == "goodput":
                s = fe.goodput(a.model, name, seed, a.requests, a.warmup, start, a.slo_scale, a.tol)
            else:
                s = fe.tightest_slo_scale(a.model, name, seed, a.requests, a.warmup, a.rate, start, a.tol)
            if s.value is not None:  # the next seed starts its search here: fewer probes, same crossing
                start = s.value
            vals.append(None if s.value is None else round(s.value, 4))
            probes.append([[round(x, 4), round(y, 4)] for x, y in s.probes])
            print(f"{name} seed {seed}: {vals[-1]} ({len(s.probes)} probes)", file=sys.stderr)
        out["values"][name] = vals
        out["mean"][name] = _mean(vals)
        out["probes"][name] = probes
    fp = out["mean"].get("flowprefill")
    ratios = {}
    for name, m in out["mean"].items():
        if name == "flowprefill" or fp is None or not m:
            continue
        ratios[name] = round(fp / m if a.metric == "goodput" else m / fp, 3)
    out["flowprefill_ratio"] = ratios
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
