"""Serving-simulator speed: one policy at paper scale, and wall time as the cluster grows.

    python bench/sim.py --json   # {"paper_scale_s", "requests_per_s", "calib_s", "mfs_paper_scale_s", "mfs_over_fs", "scaling": {...}}
    python bench/sim.py --json --split   # ... and "split": {...}: where mfs_over_fs comes from

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
skips it. ``detail.mfs_path`` says whether mfs decided in its C core
(``native``, ``laxflow.policy.mfs._core``, built at install) or on its
reference (``python``); ``detail.mfs_glue`` is kept for older readers and
says the same as a bool (admission and completion are the core's now).

``--decode`` picks the decode units' model (``ServingConfig.decode``): ``hold``
by default, named here rather than taken from the config's default (decode
batches, ``steps``, since they became it), so the figures compare across
versions; ``steps`` runs them as decode instances.

``--split`` (with ``fs``) adds three paper-scale runs that tell apart what
``mfs_over_fs`` is made of (``bench/_schedule_replay.py``): fs with the
link-load average kept (``fs_link_load_s``); mfs with its decisions
recorded (not timed); and those decisions replayed by a policy that only
copies them into the engine (``mfs_replayed_s``: the run MFS's schedule
makes, with no MFS code in it; ``replay_copy_s`` of it are the copies,
timed inside). Each must reproduce its original run (the same events and
TTFTs), else the script stops with an error. With ``schedule_s`` =
``mfs_replayed_s - replay_copy_s``, ``schedule_over_fs`` is ``schedule_s /
paper_scale_s`` (the engine and simulator's share under MFS's schedule:
more levels to fill, timer events, the link-load average, whose part
``link_load_over_fs`` is) and ``policy_over_fs`` is ``(mfs_paper_scale_s -
schedule_s) / paper_scale_s`` (MFS's own decisions and completions, with
what they cost the rest of the run in caches); the two add up to
``mfs_over_fs``. ``policy_us_per_decision`` spreads the policy's time over
the decisions. The recording holds 17 bytes per live flow per decision:
about 540 MB at paper scale (the whole ``--split`` run peaked at 0.7 GB
resident; its three runs add about 40 s to the plain one).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _schedule_replay import FsKeepingLinkLoad, RecordingMfs, ReplayedSchedule  # bench/ is on the path

from laxflow.policy.base import FlowPolicy
from laxflow.policy.mfs.policy import NATIVE
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator


def timed_run(servers: int, requests: int, warmup: int, rate: float, policy: str | FlowPolicy, model: str,
              workload: str, decode: str = "hold") -> tuple[dict, tuple]:
    """One run's figures, and its outcome (network events, every request's TTFT, bytes per stage) to compare runs."""
    cfg = ServingConfig(model=model, cluster=ClusterConfig(servers=servers), warmup=warmup, decode=decode)
    spec = RunSpec(cfg, workload, rate, "fs", requests, seed=0)  # (the workload does not depend on the policy)
    reqs = build_workload(spec)
    t0, c0 = time.perf_counter(), time.process_time()
    res = ServingSimulator(cfg, reqs, policy).run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    att = sum(1 for s in res.measured if s.ttft <= s.slo) / len(res.measured)
    outcome = (res.network_events, tuple(s.ttft for s in res.states), tuple(sorted(res.stage_bytes_delivered.items())))
    return {"servers": servers, "requests": len(reqs), "wall_s": wall, "cpu_s": cpu, "events": res.network_events,
            "batches": len(res.batches), "slo_attainment": att}, outcome


def split(paper: dict, fs_outcome: tuple, mfs: dict, run) -> dict:
    """``--split``'s runs (``run(policy)``: a paper-scale ``timed_run``) and keys; see the module doc."""
    fs_load, fs_load_outcome = run(FsKeepingLinkLoad())
    if fs_load_outcome != fs_outcome:
        raise SystemExit("bench/sim.py --split: fs with the link-load average kept ran differently from fs")
    recording = RecordingMfs()
    _, recorded_outcome = run(recording)
    replay = ReplayedSchedule(recording)
    replayed, replayed_outcome = run(replay)
    if replayed_outcome != recorded_outcome or not replay.complete:
        raise SystemExit("bench/sim.py --split: the replayed mfs schedule ran differently from the recorded mfs run")
    fs_s, mfs_s = paper["wall_s"], mfs["wall_s"]
    schedule_s = replayed["wall_s"] - replay.copy_s
    decisions = len(recording.decisions)
    return {
        "fs_link_load_s": round(fs_load["wall_s"], 3),
        "mfs_replayed_s": round(replayed["wall_s"], 3),
        "replay_copy_s": round(replay.copy_s, 3),
        "decisions": decisions,
        "link_load_over_fs": round((fs_load["wall_s"] - fs_s) / fs_s, 2),
        "schedule_over_fs": round(schedule_s / fs_s, 2),
        "policy_over_fs": round((mfs_s - schedule_s) / fs_s, 2),
        "policy_us_per_decision": round(1e6 * (mfs_s - schedule_s) / decisions, 2),
    }


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
    ap.add_argument("--decode", choices=("hold", "steps"), default="hold",
                    help="the decode units' model (ServingConfig.decode; default hold, not the config's default "
                         "steps, so figures compare across versions)")
    ap.add_argument("--split", action="store_true",
                    help="three more paper-scale runs: what mfs_over_fs is made of (needs --policy fs and the mfs run)")
    args = ap.parse_args()
    if args.split and (args.policy != "fs" or args.no_mfs):
        ap.error("--split compares mfs with fs: it needs --policy fs and the mfs run (no --no-mfs)")
    load = None
    if args.rate is None:
        if (args.model, args.workload) not in CAPACITY:
            ap.error(f"no capacity known for {args.model} on {args.workload}: give --rate")
        load, args.rate = args.load, args.load * CAPACITY[(args.model, args.workload)]
    calib = calib_s()

    sizes = [int(s) for s in args.servers.split(",")]
    def paper_run(policy: str | FlowPolicy) -> tuple[dict, tuple]:
        return timed_run(256, args.requests, args.warmup, args.rate, policy, args.model, args.workload, args.decode)

    runs, outcomes = {}, {}
    for servers in sizes:
        scale = servers / 256
        r, outcomes[servers] = timed_run(servers, max(1, round(args.requests * scale)), round(args.warmup * scale),
                                         args.rate, args.policy, args.model, args.workload, args.decode)
        runs[servers] = r
        if not args.json:
            print(json.dumps(r), file=sys.stderr)
    if 256 in runs:
        paper = runs[256]
    else:
        paper, outcomes[256] = paper_run(args.policy)
    mfs = parts = None
    if not args.no_mfs:
        mfs, _ = paper_run("mfs")
        if not args.json:
            print(json.dumps({"policy": "mfs", **mfs}), file=sys.stderr)
    if args.split:
        parts = split(paper, outcomes[256], mfs, paper_run)
        if not args.json:
            print(json.dumps({"split": parts}), file=sys.stderr)
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
        **({"split": parts} if parts else {}),
        "detail": {"policy": args.policy, "rate": args.rate, "load": load, "model": args.model, "workload": args.workload,
                   "decode": args.decode,
                   "runs": {str(s): r for s, r in runs.items()}, "mfs_run": mfs,
                   # which state mfs ran on: its C core (built at install) or the reference
                   "mfs_path": "native" if NATIVE else "python", "mfs_glue": NATIVE},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
