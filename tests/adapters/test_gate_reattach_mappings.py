"""The adapters' PermitGate while the daemon is away: it retries attaching without piling up mappings.

Found by the soak (bench/soak.py): after each daemon kill the initiator's
resident memory grew by about 5 MB and its maps held one more mapping of the
dead daemon's segment for every ``reattach_s`` the daemon was away (the gate
re-attached the stale segment, found it stale, retired it, again). A daemon
away for an hour would leave thousands of mappings of 5 MB in every job.
"""

from __future__ import annotations

import os
import time

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.protocol.shm import Segment

STALE_NS = 20_000_000


def _mappings(name: str) -> int:
    path = f"/dev/shm{name}"
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().removesuffix(" (deleted)").endswith(path))


def test_a_stale_segment_is_not_mapped_again_and_again():
    name = f"/lxf-gate-maps-{os.getpid()}-{time.monotonic_ns()}"
    first = Segment.create(name, STALE_NS)
    gate = PermitGate(GateConfig(shm_name=name, reattach_s=0.01))
    second = None
    try:
        first.heartbeat()
        assert gate.bypass_reason is None  # attached and gating
        assert _mappings(name) == 2  # ours (the daemon's) and the gate's
        time.sleep(2 * STALE_NS / 1e9)  # the daemon stops beating: it died
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # ~50 reattach attempts, all finding the stale segment
            assert "stale" in gate.bypass_reason
            time.sleep(0.01)
        assert _mappings(name) <= 3, _mappings(name)  # not one mapping per attempt
        first.close(unlink=True)  # a new daemon replaces the segment
        second = Segment.create(name, STALE_NS)
        second.heartbeat()
        assert gate.bypass_reason is None  # the gate follows it
        # the new segment twice (the daemon's, the gate's) and the old one once (the gate keeps it until close)
        assert _mappings(name) <= 3, _mappings(name)
    finally:
        gate.close()
        first.close(unlink=True)
        if second is not None:
            second.close(unlink=True)
    assert _mappings(name) == 0


def test_a_daemon_that_was_late_keeps_its_messages_completions():
    """The daemon misses its heartbeat for a moment (a loaded host) and beats again: the same daemon, so a
    message in flight meanwhile still reports its COMPLETION to it. (The soak saw a transfer wait 349 s: the
    gate had counted the late daemon as replaced, dropped its in-flight messages' completions, and the
    daemon held every later message of a lower class behind them until it was killed.)"""
    import threading

    from laxflow.protocol.shm import EventKind, Gate, Stage

    name = f"/lxf-gate-late-{os.getpid()}-{time.monotonic_ns()}"
    daemon = Segment.create(name, STALE_NS)
    gate = PermitGate(GateConfig(shm_name=name, reattach_s=0.01))
    go = threading.Event()
    try:
        daemon.heartbeat()
        fut = gate.submit(lambda permit: go.wait(10) and permit, 5, Stage.P2D, 0, 1 << 20)
        submit = [e for e in daemon.drain_events() if e["kind"] == EventKind.SUBMIT]
        assert len(submit) == 1
        msg = int(submit[0]["msg_id"])
        daemon.set_permit(msg, Gate.OPEN, 2, 10)
        daemon.publish_permits()
        deadline = time.monotonic() + 10
        while gate.stats["released"] < 1:  # running now, blocked in go.wait
            assert time.monotonic() < deadline
            daemon.heartbeat()
            time.sleep(0.001)
        time.sleep(2 * STALE_NS / 1e9)  # late: the heartbeat goes stale while the transfer runs
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # the gate retries attaching meanwhile (reattach_s 0.01)
            assert "stale" in gate.bypass_reason
            time.sleep(0.005)
        daemon.heartbeat()  # back
        assert gate.bypass_reason is None
        go.set()
        assert fut.result(timeout=10).msg_id == msg
        done = [e for e in daemon.drain_events() if e["kind"] == EventKind.COMPLETION]
        assert [int(e["msg_id"]) for e in done] == [msg]  # the daemon hears the end of its message
    finally:
        go.set()
        gate.close()
        daemon.close(unlink=True)
