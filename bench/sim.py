"""Serving-simulator speed: one policy at paper scale, and wall time as the cluster grows.

    python bench/sim.py --json   # {"paper_scale_s", "requests_per_s", "calib_s", "mfs_paper_scale_s", "mfs_over_fs", "scaling": {...}}

Paper scale (MFS §6.1): 256 servers x 8 A100 (1024 prefill GPUs = 32
Mixtral-8x22B units), 512 warm-up + 1024 measured QwenA-conversation
requests at a high load: ``--load`` (default 0.7) times the model's capacity
on the workload (``experiment.CAPACITY``, 0.812 req/s per prefill GPU for
this pair: 0.568), below saturation, where contention between requests is
real but queues stay bounded. ``--rate`` gives an absolute rate instead. ``scaling`` runs the same per-GPU rate on 32, 64,
128 and 256 servers with the request count scaled with the cluster (same
simulated duration), so a cost linear in requests shows up as wall time
proportional to the server count. Timings are wall-clock seconds of
``ServingSimulator.run`` only (workload generation excluded); quote them
with the machine they ran on. ``paper_scale_cpu_s`` and each run's
``cpu_s`` are its CPU seconds, which a loaded machine inflates less.

``calib_s`` is the wall time of a 10M-addition pure-Python loop on the same
machine in the same run (the smaller of one before and one after the
simulations), so figures from different machines compare:
``paper_scale_s / calib_s`` (target <= 45). ``mfs_paper_scale_s`` is the
paper-scale run under ``mfs`` (same workload), and ``mfs_over_fs`` its ratio
to the ``--policy`` run (target <= 1.5 with the default ``fs``); ``--no-mfs``
skips it. ``detail.mfs_path`` says whether mfs decided in C (``native``, the
module built at install) or on its Python paths.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from laxflow.policy import mfs_native
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator


def timed_run(servers: int, requests: int, warmup: int, rate: float, policy: str, model: str, workload: str) -> dict:
    cfg = ServingConfig(model=model, cluster=ClusterConfig(servers=servers), warmup=warmup)
    spec = RunSpec(cfg, workload, rate, policy, requests, seed=0)
    reqs = build_workload(spec)
    t0, c0 = time.perf_counter(), time.process_time()
    res = ServingSimulator(cfg, reqs, policy).run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    att = sum(1 for s in res.measured if s.ttft <= s.slo) / len(res.measured)
    return {"servers": servers, "requests": len(reqs), "wall_s": wall, "cpu_s": cpu, "events": res.network_events,
            "batches": len(res.batches), "slo_attainment": att}


def calib_s() -> float:
    """Seconds of a 10M-addition pure-Python loop: this machine's speed for interpreted code."""
    t0 = time.perf_counter()
    x = 0
    for _ in range(10_000_000):
        x += 1
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--policy", default="fs")
    ap.add_argument("--load", type=float, default=0.7, help="rate as a fraction of the capacity (default 0.7)")
    ap.add_argument("--rate", type=float, default=None, help="requests/s per prefill GPU (overrides --load)")
    ap.add_argument("--model", default="mixtral-8x22b")
    ap.add_argument("--workload", default="qwen-conv")
    ap.add_argument("--servers", default="32,64,128,256", help="cluster sizes of the scaling series")
    ap.add_argument("--requests", type=int, default=1024, help="measured requests at 256 servers")
    ap.add_argument("--warmup", type=int, default=512, help="warm-up requests at 256 servers")
    ap.add_argument("--no-mfs", action="store_true", help="skip the paper-scale mfs run (mfs_over_fs)")
    args = ap.parse_args()
    load = None
    if args.rate is None:
        if (args.model, args.workload) not in CAPACITY:
            ap.error(f"no capacity known for {args.model} on {args.workload}: give --rate")
        load, args.rate = args.load, args.load * CAPACITY[(args.model, args.workload)]
    calib = calib_s()

    sizes = [int(s) for s in args.servers.split(",")]
    runs = {}
    for servers in sizes:
        scale = servers / 256
        r = timed_run(servers, max(1, round(args.requests * scale)), round(args.warmup * scale), args.rate,
                      args.policy, args.model, args.workload)
        runs[servers] = r
        if not args.json:
            print(json.dumps(r), file=sys.stderr)
    paper = runs.get(256) or timed_run(256, args.requests, args.warmup, args.rate, args.policy, args.model,
                                       args.workload)
    mfs = None
    if not args.no_mfs:
        mfs = timed_run(256, args.requests, args.warmup, args.rate, "mfs", args.model, args.workload)
        if not args.json:
            print(json.dumps({"policy": "mfs", **mfs}), file=sys.stderr)
    calib = min(calib, calib_s())
    out = {
        "paper_scale_s": round(paper["wall_s"], 3),
        "requests_per_s": round(paper["requests"] / paper["wall_s"], 2),
        "calib_s": round(calib, 3),
        "paper_over_calib": round(paper["wall_s"] / calib, 1),
        "paper_scale_cpu_s": round(paper["cpu_s"], 3),
        **({"mfs_paper_scale_s": round(mfs["wall_s"], 3), "mfs_over_fs": round(mfs["wall_s"] / paper["wall_s"], 2)}
           if mfs else {}),
        "scaling": {str(s): round(r["wall_s"], 3) for s, r in runs.items()},
        "detail": {"policy": args.policy, "rate": args.rate, "load": load, "model": args.model, "workload": args.workload,
                   "runs": {str(s): r for s, r in runs.items()}, "mfs_run": mfs,
                   # which decision path mfs ran: its C step (built at install) or the Python paths
                   "mfs_path": "native" if MfsPolicy.native and mfs_native.NATIVE else "python"},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
