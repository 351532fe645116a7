"""Control-plane benchmarks (not tests; quote them with the machine they ran on).

``python bench/control_plane.py --json`` prints one object::

    {"permit_p50_us", "permit_p99_us", "events_per_s", "inter_ms_1000", ...}

Sections, one function each, each returning its keys (``--only NAME`` runs one):

* ``inter`` (:func:`bench_inter`, coordinator): ``inter_ms_1000`` is the
  coordinator's decision time with 1,000 active batches: one batch arrives
  (or departs) and :class:`~laxflow.coordinator.core.CoordinatorCore` applies
  the report, builds Algorithm 1's arrays from its cache, runs Algorithm 1
  and encodes the Decision frame (median over ``--repeats`` events; target
  <= 20 ms). ``inter_e2e_ms_1000``: the same with real processes, from a
  daemon's BatchArrival leaving its DEALER to the Decision arriving on its SUB
  (loopback TCP, a ``laxflow coordinator`` process), median.
  ``inter_cpu_ms_1000``: CPU time of the same (process time: what the
  decision costs when the machine is shared). Workload: 16 nodes x 4 ports
  at 12.5 GB/s, 1,000 batches of 1-8 requests, each request with 1-4
  transfers between random ports of 0.1-200 MB, deadlines now + 0.05-2 s
  (late batches fail the check: each run prunes up to the budget of 1).
* ``permit`` (:func:`bench_permit_latency`, node daemon): ``permit_p50_us``,
  ``permit_p99_us``: submit-to-permit latency at 10,000 messages/s.
* ``idle`` (:func:`bench_permit_idle`, node daemon and the adapters'
  :class:`PermitGate`): ``permit_idle_p50_us``, ``permit_idle_p99_us``:
  submit-to-run latency of a message that follows ``--gap-ms`` of idleness
  (a layer's compute), daemon with the testbed's ``spin_us`` 0;
  ``permit_idle_spin_*`` the same with the default ``spin_us``; ``permit_idle_acquire_*``
  the same through ``PermitGate.acquire`` (a collective's path: the caller waits itself).
* ``events`` (:func:`bench_event_rate`, node daemon): ``events_per_s``: the
  largest event rate one daemon sustains.
* ``hooks`` (:func:`bench_hooks`, hooks client and node daemon):
  ``hooks_call_up_p50_us``, ``hooks_call_up_p99_us``: one ``layer_begin``
  over the daemon's hooks socket; ``hooks_call_down_p50_us``,
  ``hooks_call_down_p99_us``: the same once the daemon is gone (kill -9),
  after the one call that waits its timeout (``hooks_call_down_first_ms``);
  target: microseconds, not the 200 ms timeout per call. ``hooks_resume_ms``:
  a new daemon on the same address until the client's first answered call.

A section not built yet reports its keys as null.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from laxflow.coordinator.core import CoordinatorConfig, CoordinatorCore
from laxflow.coordinator.server import decision_frame
from laxflow.protocol import messages as m
from laxflow.protocol.wire import decode, encode

NODES, PORTS_PER_NODE, BANDWIDTH = 16, 4, 12.5e9  # 100 Gb/s ports


def _ports() -> list[str]:
    return [f"n{n}/p{p}" for n in range(NODES) for p in range(PORTS_PER_NODE)]


def _batch(rng: np.random.Generator, bid: str, now: float, ports: list[str]) -> m.BatchInfo:
    reqs = []
    for r in range(int(rng.integers(1, 9))):
        traffic = tuple(
            m.Transfer(str(a), str(b), float(rng.uniform(1e5, 2e8)))
            for a, b in (rng.choice(ports, size=2, replace=False) for _ in range(int(rng.integers(1, 5))))
        )
        reqs.append(m.RequestInfo(f"{bid}-r{r}", now + float(rng.uniform(0.05, 2.0)), int(rng.integers(100, 8000)), 0, traffic))
    return m.BatchInfo(bid, float(rng.uniform(0.005, 0.05)), tuple(reqs))


def _hello(node: int, ports: list[str]) -> m.Hello:
    mine = tuple(m.PortInfo(p, BANDWIDTH) for p in ports if p.startswith(f"n{node}/"))
    return m.Hello(f"n{node}", "start", mine, ())


def bench_inter(args: argparse.Namespace) -> dict:
    """Coordinator decision time with 1,000 active batches (in process, and over sockets)."""
    rng = np.random.default_rng(7)
    ports = _ports()
    now = time.time()
    core = CoordinatorCore(CoordinatorConfig(drop_budget=1, coordinator_id="bench"), now)
    for n in range(NODES):
        core.handle(decode(encode(_hello(n, ports), f"n{n}")), b"x", now)
    for k in range(1000):
        core.handle(decode(encode(m.BatchArrival(f"n{k % NODES}", _batch(rng, f"b{k}", now, ports)), "d")), b"x", now)
    core.decide(now)
    times, cpu = [], []
    for k in range(args.repeats):
        # alternate: a new batch arrives, an old one departs (1,000 or 1,001 active)
        msg = (m.BatchArrival("n0", _batch(rng, f"x{k}", now, ports)) if k % 2 == 0
               else m.BatchDeparture("n0", f"x{k - 1}"))
        frame = encode(msg, "n0")
        t0, c0 = time.perf_counter(), time.process_time()
        core.handle(decode(frame), b"x", now)
        decision = core.decide(now)
        decision_frame(decision, "coordinator")  # as the server publishes it
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    out = {"inter_ms_1000": round(statistics.median(times) * 1e3, 3),
           "inter_ms_1000_p99": round(float(np.percentile(times, 99)) * 1e3, 3),
           "inter_cpu_ms_1000": round(statistics.median(cpu) * 1e3, 3),
           "inter_pruned": len(core.pruned)}
    if not args.no_e2e:
        out["inter_e2e_ms_1000"] = _bench_inter_e2e(args)
    return out


def _bench_inter_e2e(args: argparse.Namespace) -> float:
    """Median BatchArrival-sent -> Decision-received over loopback with a real coordinator process."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "coordinator"))
    from cptest import CoordinatorProcess  # the tests' launcher: free ports, readiness wait

    import tempfile

    from laxflow.coordinator.client import CoordinatorLink

    rng = np.random.default_rng(8)
    ports = _ports()
    with tempfile.TemporaryDirectory() as tmp:
        coord = CoordinatorProcess(Path(tmp), heartbeat=0.5, dead_after=30.0).start()
        link = CoordinatorLink(coord.address, "n0")
        try:
            now = time.time()
            for n in range(NODES):
                link.dealer.send(encode(_hello(n, ports), f"n{n}"))
            batches = [_batch(rng, f"b{k}", now + 60, ports) for k in range(1000)]
            link.send(m.Hello("n0", "start", _hello(0, ports).ports, tuple(batches)))
            _wait_decision(link, lambda d: len(d.order) >= 1000, 60)
            times = []
            for k in range(args.e2e_repeats):
                b = _batch(rng, f"e{k}", now + 60, ports)
                t0 = time.perf_counter()
                link.send(m.BatchArrival("n0", b))
                _wait_decision(link, lambda d, i=b.id: any(r.batch_id == i for r in d.order), 10)
                times.append(time.perf_counter() - t0)
                link.send(m.BatchDeparture("n0", b.id))
                _wait_decision(link, lambda d, i=b.id: all(r.batch_id != i for r in d.order), 10)
        finally:
            link.close()
            coord.stop()
    return round(statistics.median(times) * 1e3, 3)


def _wait_decision(link, predicate, timeout: float) -> m.Decision:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for env in link.receive(timeout_ms=50):
            if isinstance(env.body, m.Decision) and predicate(env.body):
                return env.body
    raise TimeoutError("no decision")


def bench_permit_latency(args: argparse.Namespace) -> dict:
    """Node daemon: submit-to-permit latency at 10,000 messages/s (bench/_daemon_bench.py)."""
    from _daemon_bench import bench_permit_latency as run

    return run(args)


def bench_event_rate(args: argparse.Namespace) -> dict:
    """Node daemon: largest sustained event rate (bench/_daemon_bench.py)."""
    from _daemon_bench import bench_event_rate as run

    return run(args)


def bench_permit_idle(args: argparse.Namespace) -> dict:
    """Node daemon: submit-to-run latency through PermitGate after an idle gap (bench/_daemon_bench.py)."""
    from _daemon_bench import bench_permit_idle as run

    return run(args)


def bench_hooks(args: argparse.Namespace) -> dict:
    """Hooks client: call latency with the daemon up and down (bench/_daemon_bench.py)."""
    from _daemon_bench import bench_hooks_calls as run

    return run(args)


SECTIONS = {"inter": bench_inter, "permit": bench_permit_latency, "idle": bench_permit_idle,
            "events": bench_event_rate, "hooks": bench_hooks}


def _machine() -> str:
    from _machine import cpu_model

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu_model()}, {os.cpu_count()} cores, load {load:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    ap.add_argument("--repeats", type=int, default=50, help="events timed in process (inter)")
    ap.add_argument("--e2e-repeats", type=int, default=20, help="events timed over sockets (inter)")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="idle time before each message (idle)")
    ap.add_argument("--idle-messages", type=int, default=200, help="messages timed (idle)")
    ap.add_argument("--no-e2e", action="store_true", help="skip the socket measurement (inter)")
    ap.add_argument("--hooks-calls", type=int, default=2000, help="calls timed each way (hooks)")
    args = ap.parse_args()
    out: dict = {}
    for name in args.only or SECTIONS:
        out.update(SECTIONS[name](args))
    out["machine"] = _machine()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:24} {v}")


if __name__ == "__main__":
    main()
