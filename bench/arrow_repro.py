"""Arrow (paper 002 §7.2-7.4) in the iteration-level simulator: sustainable rate at 90 % SLO attainment.

Not a test. For each system and seed, the largest cluster request rate whose
SLO attainment (TTFT and TPOT both within the workload's SLO, every request
counted, as the paper replays whole traces) is >= 90 %: a geometric scan by
x1.5 from 1 req/s per instance, then ``--bisect`` halvings (in log rate)
between the last rate that held and the first that did not.

Systems (``--instances`` instances of llama3-8b on one A800 each, compute model):

* ``arrow``: elastic pools, start P:D = half:half, local scheduler Sarathi (decode first,
  512-token chunks);
* ``static-pd``: the same split fixed, min-load dispatch (the paper's "Minimal Load" ablation);
* ``round-robin``: the same split fixed, round robin;
* ``colocated``: every instance PD-colocated (TP1 each), Sarathi + vLLM's request-count balancer
  (``dplb``): vLLM run data-parallel;
* ``vllm``: the paper's vLLM baseline: ONE colocated instance over all the GPUs (TP = instances),
  Sarathi (chunked prefill, decode first);
* ``vllm-disagg``: the paper's vLLM-disaggregated baseline: one prefill + one decode instance of
  half the GPUs each (TP 4 + TP 4 on 8), KV of every prompt over the network;
* ``NAME@P`` (e.g. ``static-pd@7``): a pool manager starting from P prefill instances instead of half.

Scaling (§7.4): ``arrow`` and ``static-pd`` on ``--scaling`` instance counts.

Output: one JSON object: per system the per-seed sustainable rates, their mean,
and Arrow's ratio over each baseline (mean of per-seed ratios), the scaling
table (mean rate, and rate per instance: constant = linear), run counts and
wall time. ``python bench/arrow_repro.py --json``;
quote it with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from laxflow.sim.serving.instances.config import InstanceSimConfig
from laxflow.sim.serving.instances.engine import InstanceEngine
from laxflow.sim.serving.instances.metrics import summarize
from laxflow.sim.serving.instances.pools import create_pool_dispatcher, reshape_config
from laxflow.sim.workload.slo_traces import generate_slo_workload, slo_of

TARGET = 0.9
SYSTEMS = ("arrow", "static-pd", "round-robin", "colocated", "vllm", "vllm-disagg")


def attainment(system: str, workload: str, instances: int, rate: float, n: int, seed: int) -> dict[str, Any]:
    """One run at cluster rate ``rate``: its metrics row plus the pool driver's flip counts."""
    ttft, tpot = slo_of(workload)
    system, _, at = system.partition("@")  # "static-pd@7": that P count instead of half
    split = None if system in ("colocated", "vllm") else int(at) if at else instances // 2
    config = InstanceSimConfig(instances=instances, prefill_instances=split, scheduler="sarathi", router="dplb",
                               pools=None if system == "colocated" else system, ttft_slo=ttft, tpot_slo=tpot,
                               seed=seed)
    config = reshape_config(config)  # vllm / vllm-disagg: the same GPUs as wider TP instances
    dispatcher = None if system == "colocated" else create_pool_dispatcher(system, config)
    result = InstanceEngine(config, generate_slo_workload(workload, rate, n, seed), dispatcher=dispatcher).run()
    row = summarize(result, rate, {"policy": "fs", "pools": None if system == "colocated" else system})
    out = {k: row[k] for k in ("slo_attainment", "ttft_attainment", "tpot_attainment", "ttft_p90", "tpot_p90")}
    if dispatcher is not None:
        out.update(dispatcher.result_keys())
    return out


def sustainable(system: str, workload: str, instances: int, n: int, seed: int, bisect: int,
                log: list[dict[str, Any]]) -> float:
    """The largest cluster rate (req/s) with attainment >= TARGET found by scan and bisection."""

    def ok(rate: float) -> bool:
        row = attainment(system, workload, instances, rate, n, seed)
        log.append({"system": system, "instances": instances, "seed": seed, "rate": round(rate, 4), **row})
        return row["slo_attainment"] >= TARGET

    rate = 1.0 * instances
    if ok(rate):
        good, bad = rate, None
        while bad is None and good < 1e4:
            rate = good * 1.5
            if ok(rate):
                good = rate
            else:
                bad = rate
    else:
        bad, good = rate, None
        while good is None and bad > 1e-3:
            rate = bad / 1.5
            if ok(rate):
                good = rate
            else:
                bad = rate
    if good is None or bad is None:
        return good or 0.0
    for _ in range(bisect):
        mid = (good * bad) ** 0.5
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="azure-code")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--scaling", default="2,4,8,16", help="instance counts for arrow and static-pd ('' skips)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--bisect", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print JSON only (the default prints it too)")
    ap.add_argument("--runs", action="store_true", help="include every run's row in the output")
    args = ap.parse_args()
    t0 = time.perf_counter()
    log: list[dict[str, Any]] = []
    seeds = list(range(args.seeds))
    systems = [s for s in args.systems.split(",") if s]
    rates: dict[str, list[float]] = {}
    for system in systems:
        rates[system] = [sustainable(system, args.workload, args.instances, args.requests, s, args.bisect, log)
                         for s in seeds]
        print(f"{system}: {rates[system]}", file=sys.stderr)
    out: dict[str, Any] = {
        "workload": args.workload, "slo": slo_of(args.workload), "instances": args.instances,
        "deployment": InstanceSimConfig().deployment, "requests": args.requests, "seeds": seeds,
        "target_attainment": TARGET,
        "sustainable_rate": {s: {"per_seed": [round(r, 3) for r in v], "mean": round(statistics.mean(v), 3)}
                             for s, v in rates.items()},
    }
    if "arrow" in rates:
        out["arrow_over"] = {
            s: round(statistics.mean(a / b for a, b in zip(rates["arrow"], v) if b > 0), 3)
            for s, v in rates.items() if s != "arrow" and any(b > 0 for b in v)}
    if args.scaling:
        table: dict[str, dict[int, float]] = {}
        for system in ("arrow", "static-pd"):
            table[system] = {}
            for k in (int(x) for x in args.scaling.split(",") if x):
                v = rates[system] if k == args.instances and system in rates else \
                    [sustainable(system, args.workload, k, args.requests, s, args.bisect, log) for s in seeds]
                table[system][k] = round(statistics.mean(v), 3)
                print(f"scaling {system} {k}: {v}", file=sys.stderr)
        out["scaling_mean_rate"] = table
        # Linear scaling keeps the sustainable rate per instance constant.
        out["scaling_rate_per_instance"] = {s: {k: round(v / k, 3) for k, v in row.items()} for s, row in table.items()}
    out["runs"] = len(log)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.runs:
        out["run_rows"] = log
    print(json.dumps(out))


if __name__ == "__main__":
    main()
