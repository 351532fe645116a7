"""An idle daemon sleeps until something arrives: it does not poll, and the
first message after a quiet gap still gets its permit (the doorbell)."""

from __future__ import annotations

import time

from daemontest import wait_for

from laxflow.adapters.gate import GateConfig, PermitGate


def _switches(pid: int) -> int:
    """Context switches of the daemon's loop thread (its main thread)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


def test_an_idle_daemon_blocks_instead_of_polling(start_daemon):
    """spin_us 0, stale_ms 100: the loop wakes for its heartbeat (every 25 ms),
    about 40 times a second. Polling with poll_us 50 wakes it thousands of
    times a second (the loop this replaced: naps of 50 us doubling to 1 ms)."""
    d = start_daemon(config={"spin_us": 0, "poll_us": 50, "stale_ms": 100})
    time.sleep(0.3)  # start-up work done
    before = _switches(d.proc.pid)
    time.sleep(1.0)
    woke = _switches(d.proc.pid) - before
    assert woke < 200, f"an idle daemon woke {woke} times in a second"


def test_a_message_after_a_quiet_gap_is_permitted(start_daemon):
    d = start_daemon(config={"spin_us": 0, "poll_us": 50, "stale_ms": 100})
    gate = PermitGate(GateConfig(shm_name=d.shm))
    try:
        wait_for(lambda: gate.bypass_reason is None, what="gate attached")
        gate.layer_boundary(11, 0)
        for _ in range(5):
            time.sleep(0.1)  # the daemon has gone to sleep on its doorbell
            permits = []
            gate.submit(permits.append, 11, 2, 0, 4096, handle=1).result(timeout=10)
            assert permits and permits[0] is not None, "released without a permit (failed open)"
        assert gate.stats["failopen"] == 0 and gate.stats["released"] == 5
    finally:
        gate.close()


def test_a_killed_daemons_doorbell_is_removed_with_its_segment(start_daemon):
    """SIGKILL leaves the segment and its doorbell FIFO; removing the segment by
    name (what a successor daemon and the testbed do) removes the bell too."""
    import os

    from laxflow.protocol.shm import Segment

    d = start_daemon(config={"spin_us": 0, "stale_ms": 100})
    seg = Segment.attach(d.shm)
    bell = seg.bell_path
    seg.close(unlink=False)
    assert os.path.exists(bell)
    d.kill()
    assert os.path.exists(bell)  # nobody closed it
    assert Segment.unlink_name(d.shm)
    assert not os.path.exists(bell)


def test_a_stopped_daemon_removes_its_doorbell(start_daemon):
    import os

    from laxflow.protocol.shm import Segment

    d = start_daemon(config={"spin_us": 0, "stale_ms": 100})
    seg = Segment.attach(d.shm)
    bell = seg.bell_path
    seg.close(unlink=False)
    assert d.terminate() == 0
    assert not os.path.exists(bell)
