"""A producer faster than the daemon drains: the event ring fills, drops are counted, the job never blocks.

The daemon is paused with SIGSTOP (its heartbeat stays fresh for the shims:
staleness and the shim's deferral bound are 10 minutes here, so neither can
release anything in the test's time) and a producer fills the event ring
through ``protocol/shm.py`` until a push is refused. Then a C verbs program
under the real shim posts tagged messages and an adapter (``PermitGate``)
submits one: their SUBMITs find the ring full, are counted in the segment's
``events_dropped``, and the traffic goes at once in its connection's class
(fail open) instead of waiting for a permit the daemon cannot give. Resumed,
the daemon drains the ring, reports the drops (``laxflow_daemon_ring_drops``)
and gates new messages again.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from daemontest import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))
from shimtest import Client, client_env, log_by_qp, run_client  # noqa: E402

from laxflow.adapters.gate import GateConfig, PermitGate  # noqa: E402
from laxflow.protocol.shm import EventKind, Gate, Segment, Stage  # noqa: E402
from laxflow.shim import shim_path  # noqa: E402

REQUEST = 57
LONG_MS = "600000"
RING_SLOTS = 65536  # LXF_EVENT_RING_SLOTS


def _fill(seg: Segment) -> int:
    """Push layer boundaries until the ring refuses one; returns how many it took."""
    n = 0
    while seg.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=n % 80):
        n += 1
        assert n <= 2 * RING_SLOTS, "the ring never filled: is the daemon still draining?"
    return n


def test_full_ring_drops_are_counted_and_the_job_never_blocks(native_bin, tmp_path, start_daemon):
    d = start_daemon(config={"window_bytes": 0, "stale_ms": int(LONG_MS)})
    args = ["direct", "2", "40", "1"]
    ref_log = tmp_path / "reference.log"
    ref = run_client(native_bin, args, client_env(native_bin, ref_log))
    assert ref.returncode == 0, ref.stderr
    ref = log_by_qp(ref_log)
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"],
                    client_env(native_bin, log, shim_path(), d.shm, LAXFLOW_STALE_MS=LONG_MS,
                               LAXFLOW_MAX_DEFER_MS=LONG_MS))
    seg = Segment.attach(d.shm)
    gate = PermitGate(GateConfig(shm_name=d.shm))
    stopped = False
    try:
        pid, qps = client.qps()
        plan = client.plan(len(qps), 1)
        os.kill(d.proc.pid, signal.SIGSTOP)
        stopped = True
        pushed = _fill(seg)
        assert RING_SLOTS - 64 <= pushed <= RING_SLOTS, pushed  # what the daemon drained before it stopped aside
        dropped = seg.counters()["events_dropped"]
        assert dropped == 1  # the refused push, counted

        # the job: two tagged messages whose SUBMITs meet the full ring
        seg.tag_qp(pid, qps[0], REQUEST, Stage.COLLECTIVE, 0, bytes=plan[qps[0], 0])
        seg.tag_qp(pid, qps[1], REQUEST, Stage.REUSE, 3, bytes=plan[qps[1], 0])
        client.send()
        client.expect("DONE", timeout=30)  # far inside the 10 min bounds: nothing waited for a permit
        assert client.wait() == 0
        assert log_by_qp(log) == ref  # every WR posted once, per-QP order kept
        c = seg.counters()
        assert c["events_dropped"] >= dropped + 2, c  # each message's SUBMIT refused and counted
        assert c["wr_deferred"] == 0 and c["wr_defer_timeouts"] == 0, c  # none held

        # an adapter's submit meets the full ring too: it runs at once, without a permit
        fut = gate.submit(lambda permit: ("ran", permit), REQUEST, Stage.P2D, 1, 1 << 20)
        assert fut.result(timeout=10) == ("ran", None)
        assert gate.stats["bypassed"] == 1 and seg.counters()["events_dropped"] == c["events_dropped"] + 1

        os.kill(d.proc.pid, signal.SIGCONT)
        stopped = False
        total = seg.counters()["events_dropped"]
        wait_for(lambda: f'laxflow_daemon_ring_drops{{node="{d.node}"}} {float(total)}' in d.metrics(),
                 timeout=20, what="the daemon reporting the ring drops")
        msg = seg.alloc_msg_id()  # drained: the daemon gates new messages again
        assert seg.push_event(EventKind.SUBMIT, msg, REQUEST, 1 << 20, Stage.P2D, 1, 1)
        p = wait_for(lambda: seg.get_permit(msg), timeout=20, what="a permit after the ring drained")
        assert p.gate == Gate.OPEN
        assert seg.counters()["events_dropped"] == total
        assert d.terminate() == 0, "".join(d.log)
    finally:
        if stopped:
            os.kill(d.proc.pid, signal.SIGCONT)
        gate.close()
        seg.close(unlink=False)
