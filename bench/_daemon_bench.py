"""The node daemon's part of ``bench/control_plane.py`` (not a test; prints nothing itself).

Both functions start a real ``laxflow daemon`` process on a private segment
and drive it from this process through the shim's shared-memory ring, as a
shim or adapter would (``Segment.push_event``), and read permits back from the
permit table:

* :func:`bench_permit_latency` -- submit-to-permit latency at a steady
  10,000 messages/s: for each message, the time from pushing its SUBMIT to
  seeing its gate open in the permit table (then its COMPLETION is pushed).
  Keys ``permit_p50_us``, ``permit_p99_us`` (targets <= 100 us, <= 2 ms).
* :func:`bench_event_rate` -- the largest event rate one daemon sustains:
  this process pushes SUBMIT/COMPLETION pairs as fast as the ring takes them
  (retrying when it is full) and the daemon's consumer cursor is read over a
  measurement window. Key ``events_per_s``.

* :func:`bench_hooks_calls` -- the cost of one hooks call
  (:class:`~laxflow.hooks.client.HooksClient`, ``layer_begin``: a
  scheduler's most frequent call) over the daemon's real ``ipc://`` hooks
  socket while the daemon is up, and after it is killed (-9): the first call
  then waits its timeout once (``hooks_call_down_first_ms``), every later one
  returns at once. Keys ``hooks_call_up_p50_us``, ``hooks_call_up_p99_us``,
  ``hooks_call_down_p50_us``, ``hooks_call_down_p99_us`` (target: down in
  microseconds, not the 200 ms timeout per call). ``hooks_resume_ms``: from
  a new daemon's segment going live on the same address to the client's
  first answered call (the reconnect probe's backoff, 20 ms doubling to 1 s,
  included).

``python bench/_daemon_bench.py`` runs them and prints their JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from laxflow.protocol.shm import EventKind, Gate, Segment, SegmentError, Stage

LAXFLOW = str(Path(sys.executable).with_name("laxflow"))


class _Daemon:
    def __init__(self, tmp: str, config: dict | None = None) -> None:
        self.shm = f"/lxf-bench-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        ports = Path(tmp) / "ports.json"
        ports.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 100}]}))
        cfg = Path(tmp) / "daemon.json"
        cfg.write_text(json.dumps(config or {"poll_us": 20, "stale_ms": 1000}))
        self.proc = subprocess.Popen(
            [LAXFLOW, "daemon", "--node", "bench", "--shm", self.shm, "--ports", str(ports), "--config", str(cfg),
             "--hooks", f"ipc://{tmp}/hooks.sock", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.seg = Segment.attach(self.shm)
                if self.seg.live():
                    break
                self.seg.close(unlink=False)
            except SegmentError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("daemon did not start")
            time.sleep(0.01)

    def close(self) -> None:
        self.seg.close(unlink=False)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        Segment.unlink_name(self.shm)


def _open(seg: Segment, msg_id: int) -> bool:
    p = seg.get_permit(msg_id)
    return p is not None and p.gate == Gate.OPEN


def bench_permit_latency(args=None) -> dict:
    """Submit-to-permit latency (us) with SUBMITs pushed open-loop at ``rate`` messages/s for ``seconds``.

    One loop does both sides, as a shim would: when a message's slot comes it
    pushes the SUBMIT; in between it polls the permit table for every message
    still waiting, records the latency when its gate opens and pushes its
    COMPLETION. Latency includes this loop's own polling delay.
    """
    rate = float(getattr(args, "rate", 10_000))
    seconds = float(getattr(args, "seconds", 3.0))
    with tempfile.TemporaryDirectory() as tmp:
        d = _Daemon(tmp)
        try:
            seg = d.seg
            request = 4242
            seg.push_event(EventKind.LAYER_BOUNDARY, request_id=request, layer=0)
            period_ns = int(1e9 / rate)
            n = int(rate * seconds)
            lat: list[float] = []
            waiting: dict[int, int] = {}  # msg id -> submit time (ns)
            lost = 0
            start = time.monotonic_ns()
            sent = 0
            while sent < n or waiting:
                now = time.monotonic_ns()
                if sent < n and now >= start + sent * period_ns:
                    msg = seg.alloc_msg_id()
                    seg.push_event(EventKind.SUBMIT, msg, request, 65536, Stage.COLLECTIVE, 0, 1)
                    waiting[msg] = time.monotonic_ns()
                    sent += 1
                if not waiting and sent < n and now < start + sent * period_ns:
                    os.sched_yield()  # nothing due: leave the CPU to the daemon (2-core machines)
                    continue
                for msg, t0 in list(waiting.items()):
                    if _open(seg, msg):
                        lat.append((time.monotonic_ns() - t0) / 1e3)
                        seg.push_event(EventKind.COMPLETION, msg, request, 65536, Stage.COLLECTIVE, 0, 1)
                        del waiting[msg]
                    elif now - t0 > 1_000_000_000:
                        lost += 1
                        del waiting[msg]
            achieved = n / ((time.monotonic_ns() - start) / 1e9)
        finally:
            d.close()
    warm = np.array(lat[len(lat) // 10:])  # first 10 %: the daemon's code paths warming up
    return {"permit_p50_us": round(float(np.percentile(warm, 50)), 1),
            "permit_p99_us": round(float(np.percentile(warm, 99)), 1),
            "permit_messages": n, "permit_rate_per_s": round(achieved), "permit_timeouts": lost}


def bench_event_rate(args=None) -> dict:
    """Events/s the daemon's consumer takes off the ring while a producer keeps it non-empty."""
    seconds = float(getattr(args, "event_seconds", 3.0))
    with tempfile.TemporaryDirectory() as tmp:
        d = _Daemon(tmp)
        try:
            seg = d.seg
            request = 4343
            seg.push_event(EventKind.LAYER_BOUNDARY, request_id=request, layer=0)
            ring = seg.raw.events
            t_end = time.monotonic() + seconds
            t_measure = time.monotonic() + seconds / 3  # warm-up third, then measure
            head0 = t0 = None
            full = 0
            msg = 1 << 40
            while time.monotonic() < t_end:
                for _ in range(256):
                    msg += 1
                    while not seg.push_event(EventKind.SUBMIT, msg, request, 4096, Stage.REUSE, 1, 1):
                        full += 1
                    while not seg.push_event(EventKind.COMPLETION, msg, request, 4096, Stage.REUSE, 1, 1):
                        full += 1
                if head0 is None and time.monotonic() >= t_measure:
                    head0, t0 = int(ring.head), time.monotonic()
            head1, t1 = int(ring.head), time.monotonic()
        finally:
            d.close()
    return {"events_per_s": round((head1 - head0) / (t1 - t0)), "event_ring_full_retries": full}


def bench_permit_idle(args=None) -> dict:
    """Submit-to-run latency (us) of one message after an idle gap, through :class:`PermitGate`.

    The testbed's pattern: a layer's few messages, then ``gap_ms`` of compute
    with nothing to do. Each message goes through the adapters' whole path
    (SUBMIT on the ring, the daemon's step, the permit table, the gate's
    waiter, a worker thread) and the latency ends when ``run`` starts. The
    daemon runs with the testbed's settings (``spin_us`` 0: no spinning, so
    it takes no CPU from the job) and, for comparison, the default
    (spinning 2 ms after work, which an idle gap outlasts).
    ``permit_idle_acquire``: the same (``spin_us`` 0) through
    :meth:`PermitGate.acquire`, the collectives' path: the caller's own thread
    waits for the permit, no waiter or worker thread in between.
    """
    from laxflow.adapters.gate import GateConfig, PermitGate

    gap = float(getattr(args, "gap_ms", 20.0)) * 1e-3
    n = int(getattr(args, "idle_messages", 200))
    def through_submit(gate: PermitGate, request: int) -> float:
        t0 = time.monotonic()
        started: list[float] = []
        gate.submit(lambda permit: started.append(time.monotonic()), request, 2, 0, 65536, handle=1).result(timeout=10)
        return started[0] - t0

    def through_acquire(gate: PermitGate, request: int) -> float:
        t0 = time.monotonic()
        ticket = gate.acquire(request, 2, 0, 65536, handle=1)
        waited = time.monotonic() - t0
        if ticket.permit is None:
            raise RuntimeError("permit_idle_acquire: the gate failed open; no daemon latency to time")
        gate.release(ticket)
        return waited

    out: dict = {}
    for key, spin, one in (("permit_idle", 0, through_submit), ("permit_idle_spin", 2000, through_submit),
                           ("permit_idle_acquire", 0, through_acquire)):
        with tempfile.TemporaryDirectory() as tmp:
            d = _Daemon(tmp, {"poll_us": 50, "stale_ms": 100, "spin_us": spin})
            gate = PermitGate(GateConfig(shm_name=d.shm))
            try:
                request = 4545
                gate.layer_boundary(request, 0)
                lat: list[float] = []
                for i in range(n):
                    time.sleep(gap)
                    lat.append(one(gate, request) * 1e6)
            finally:
                gate.close()
                d.close()
        warm = np.array(lat[len(lat) // 10:])  # the first tenth warms the daemon and the caches
        out[f"{key}_p50_us"] = round(float(np.percentile(warm, 50)), 1)
        out[f"{key}_p99_us"] = round(float(np.percentile(warm, 99)), 1)
    return out



def bench_hooks_calls(args=None) -> dict:
    """Hooks call latency with the daemon up, then down (kill -9): ``layer_begin`` timed call by call."""
    from laxflow.hooks.client import HooksClient

    calls = getattr(args, "hooks_calls", 2000) if args is not None else 2000
    with tempfile.TemporaryDirectory() as tmp:
        d = _Daemon(tmp)
        hooks = HooksClient(f"ipc://{tmp}/hooks.sock", timeout_ms=200)
        try:
            hooks.register_request("bench", deadline=time.time() + 60, prompt_tokens=1000)
            hooks.batch_formed("b", ["bench"])
            up = []
            for k in range(calls):
                t0 = time.perf_counter_ns()
                hooks.layer_begin("b", k % 80)
                up.append(time.perf_counter_ns() - t0)
            d.seg.close(unlink=False)
            d.proc.kill()
            d.proc.wait(30)
            t0 = time.perf_counter_ns()
            hooks.layer_begin("b", 0)  # unanswered: the one call that waits its timeout
            first_ns = time.perf_counter_ns() - t0
            down = []
            for k in range(calls):
                t0 = time.perf_counter_ns()
                hooks.layer_begin("b", k % 80)
                down.append(time.perf_counter_ns() - t0)
            dropped = hooks.dropped
            Segment.unlink_name(d.shm)
            d = _Daemon(tmp)  # a new daemon on the same hooks address
            t0 = time.perf_counter_ns()
            while hooks.status() is None:  # fails open at once until the reconnect probe is answered
                time.sleep(0.0005)
            resume_ns = time.perf_counter_ns() - t0
        finally:
            hooks.close()
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait(30)
            Segment.unlink_name(d.shm)
    up_us, down_us = np.array(up) / 1e3, np.array(down) / 1e3
    return {"hooks_call_up_p50_us": round(float(np.percentile(up_us, 50)), 1),
            "hooks_call_up_p99_us": round(float(np.percentile(up_us, 99)), 1),
            "hooks_call_down_first_ms": round(first_ns / 1e6, 1),
            "hooks_call_down_p50_us": round(float(np.percentile(down_us, 50)), 2),
            "hooks_call_down_p99_us": round(float(np.percentile(down_us, 99)), 2),
            "hooks_calls_dropped": dropped, "hooks_resume_ms": round(resume_ns / 1e6, 1)}


if __name__ == "__main__":
    out = bench_permit_latency()
    out.update(bench_event_rate())
    print(json.dumps(out))
