"""SIGTERM to a ``laxflow daemon`` while a real job's work requests are held by its permits.

A C verbs program under the real shim (fake verbs provider) posts a collective
and a reuse fetch; the daemon holds the reuse fetch behind a collective that
nobody completes. Both the daemon's staleness and the shim's deferral bound
are 10 minutes here, so only the daemon's own shutdown can release the held WRs in
the test's time: SIGTERM must open the gates (and tell the shims to pass
through), every posted WR must reach the device exactly once in order, and
the daemon must exit 0.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from daemontest import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))
from shimtest import Client, client_env, log_by_qp, run_client  # noqa: E402

from laxflow.protocol.shm import EventKind, Segment, Stage  # noqa: E402
from laxflow.shim import shim_path  # noqa: E402

REQUEST = 91
LONG_MS = "600000"  # neither staleness nor the deferral bound (10 min) may release anything in the test


def test_sigterm_with_held_wrs_opens_the_gates_loses_nothing_exits_0(native_bin, tmp_path, start_daemon):
    d = start_daemon(config={"window_bytes": 0, "stale_ms": int(LONG_MS)})
    args = ["direct", "2", "30", "1"]
    ref_log = tmp_path / "reference.log"
    ref = run_client(native_bin, args, client_env(native_bin, ref_log))
    assert ref.returncode == 0, ref.stderr
    ref = log_by_qp(ref_log)
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"],
                    client_env(native_bin, log, shim_path(), d.shm, LAXFLOW_STALE_MS=LONG_MS,
                               LAXFLOW_MAX_DEFER_MS=LONG_MS))
    seg = Segment.attach(d.shm)
    try:
        pid, qps = client.qps()
        plan = client.plan(len(qps), 1)
        blocker = seg.alloc_msg_id()
        seg.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=0)
        seg.push_event(EventKind.SUBMIT, blocker, REQUEST, 1 << 30, Stage.COLLECTIVE, 0, 999)
        wait_for(lambda: seg.get_permit(blocker), what="blocker granted")
        seg.tag_qp(pid, qps[0], REQUEST, Stage.COLLECTIVE, 0, bytes=plan[qps[0], 0])
        reuse = seg.tag_qp(pid, qps[1], REQUEST, Stage.REUSE, 3, bytes=plan[qps[1], 0])
        client.send()
        client.expect("POSTED 0")
        total = sum(len(v) for v in ref.values())
        wait_for(lambda: seg.counters()["wr_deferred"] > 0, what="the reuse fetch's WRs held by the shim")
        time.sleep(0.1)
        assert seg.get_permit(reuse) is None
        held = total - log.read_text().count("POST ")
        assert held > 0  # the reuse fetch is held under load

        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        client.expect("DONE", timeout=30)  # far inside the 10 min bounds: the shutdown released them
        released = time.monotonic() - t0
        rc = d.proc.wait(20)
        exited = time.monotonic() - t0
        assert rc == 0, "".join(d.log)
        assert client.wait() == 0
        assert log_by_qp(log) == ref  # every posted WR reached the device once, per-QP order kept
        c = seg.counters()
        assert c["wr_deferred"] > 0 and c["wr_defer_timeouts"] == 0, c
        assert c["wr_released"] + c["wr_failopen"] >= c["wr_deferred"], c  # none held forever
        assert any("gates open" in line for line in d.log), "".join(d.log)
        print(f"SIGTERM released {held} held WRs in {released * 1000:.0f} ms, exited 0 after {exited * 1000:.0f} ms;"
              f" counters {c}")
    finally:
        seg.close(unlink=False)
