"""Hash of every simulated result on a fixed set of serving runs: the check that an engine speed-up changed nothing.

    python bench/sim_digest.py            # {"fs-16": "<sha256>", ..., "_cpu_s": {...}}
    python bench/sim_digest.py --only fs-16,mfs-16

Run it on the old code and the new (same venv) and compare the JSON: every
hash must be equal. Each hash covers, per request (arrival order), the batch,
batch start, compute end, finish (TTFT end), stall, P2D count and bytes per
stage; per batch, its start, compute end, stall and every layer's CCT; the
network's event count and bytes delivered per stage. Floats are hashed by
their exact bits (``float.hex``), so a last-bit difference shows. The first
twelve runs hold their decode units (``decode = "hold"``, named here so their
hashes compare across versions); the ``-steps`` runs decode (the config's
default) and their hash also covers every request's token times. CPU
seconds per run (``time.process_time``) are printed alongside, for a rough
A/B; they are not part of the hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import replace

from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator

MIX = ("mixtral-8x22b", "qwen-conv")
LLAMA = ("llama3-8b", "mooncake-conv")

# name: (model, workload, servers, load x capacity, policy, measured, warm-up, extra ServingConfig fields)
CONFIGS = {
    "fs-16": (*MIX, 16, 0.7, "fs", 120, 60, {}),
    "mfs-16": (*MIX, 16, 0.7, "mfs", 120, 60, {}),
    "edf-16": (*MIX, 16, 0.7, "edf", 120, 60, {}),
    "sjf-16": (*MIX, 16, 0.7, "sjf", 120, 60, {}),
    "karuna-16": (*MIX, 16, 0.7, "karuna", 120, 60, {}),
    "fs-32": (*MIX, 32, 0.9, "fs", 160, 80, {}),
    "mfs-32": (*MIX, 32, 0.9, "mfs", 160, 80, {}),
    "fs-llama": (*LLAMA, 16, 0.8, "fs", 150, 50, {}),
    "mfs-llama": (*LLAMA, 16, 0.8, "mfs", 150, 50, {}),
    "fs-16-ttft-dispatch": (*MIX, 16, 0.7, "fs", 80, 40, {"router_dispatch": "ttft"}),
    "mfs-llama-flowprefill": (*LLAMA, 16, 0.8, "mfs", 80, 40, {"prefill": "flowprefill"}),
    "edf-16-lookahead": (*MIX, 16, 0.7, "edf", 80, 40, {"reuse_lookahead": 2}),
    "fs-16-steps": (*MIX, 16, 0.7, "fs", 120, 60, {"decode": "steps"}),
    "mfs-16-steps": (*MIX, 16, 0.7, "mfs", 120, 60, {"decode": "steps"}),
    "mfs-llama-flowprefill-steps": (*LLAMA, 16, 0.8, "mfs", 80, 40, {"prefill": "flowprefill", "decode": "steps"}),
}


def _h(x: float | None) -> str:
    return "-" if x is None else float(x).hex()


def digest(name: str) -> tuple[str, float]:
    """(sha256 of the run's results, CPU seconds of ServingSimulator.run)."""
    model, workload, servers, load, policy, requests, warmup, extra = CONFIGS[name]
    cfg = replace(ServingConfig(model=model, cluster=ClusterConfig(servers=servers), warmup=warmup, decode="hold"),
                  **extra)
    spec = RunSpec(cfg, workload, load * CAPACITY[(model, workload)], policy, requests, seed=0)
    reqs = build_workload(spec)
    t0 = time.process_time()
    res = ServingSimulator(cfg, reqs, policy).run()
    cpu = time.process_time() - t0
    h = hashlib.sha256()
    for s in res.states:
        h.update(f"{s.id}|{s.index}|{s.batch}|{_h(s.batch_start)}|{_h(s.compute_end)}|{_h(s.finish)}|"
                 f"{_h(s.stall)}|{s.p2d_pending}|{sorted((k, _h(v)) for k, v in s.bytes.items())}\n".encode())
    for b in res.batches:
        h.update(f"{b.id}|{_h(b.start)}|{_h(b.compute_end)}|{_h(b.stall)}|{[_h(c) for c in b.cct]}\n".encode())
    for index, seq in sorted((res.decode or {}).items()):  # decode steps: every token's time
        h.update(f"{index}|{[_h(t) for t in seq.token_times]}\n".encode())
    h.update(f"{res.network_events}|{sorted((k, _h(v)) for k, v in res.stage_bytes_delivered.items())}|"
             f"{_h(res.sim_time)}".encode())
    return h.hexdigest(), cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated config names (default: all)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown config(s) {', '.join(unknown)}: expected some of {', '.join(CONFIGS)}")
    out: dict = {}
    cpu: dict = {}
    for n in names:
        out[n], cpu[n] = digest(n)
        cpu[n] = round(cpu[n], 3)
    out["_cpu_s"] = cpu
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
