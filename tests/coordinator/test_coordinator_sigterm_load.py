"""SIGTERM to a ``laxflow coordinator`` under a stream of reports from two real daemons.

Each daemon gets a steady stream of work: a hooks client reporting batches
(register_request, batch_formed, layer_begin/end, request_done: each batch an
arrival and a departure report to the coordinator) and messages pushed into
its segment as an adapter would (SUBMIT, wait for the permit, COMPLETION).
The coordinator is sent SIGTERM in the middle of it: it exits 0, the daemons
fall back to local scheduling and keep granting every message (none lost,
none left live), the hooks calls never raise, and both daemons exit 0 at the end.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from cptest import CoordinatorProcess

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
from daemontest import DaemonProc, wait_for  # noqa: E402

from laxflow.coordinator.client import request_status  # noqa: E402
from laxflow.hooks import HooksClient, request_key  # noqa: E402
from laxflow.protocol.shm import EventKind, Gate, Segment, Stage  # noqa: E402


class Stream:
    """Reports and messages into one daemon on a thread, until stopped; counts what happened."""

    def __init__(self, daemon: DaemonProc) -> None:
        self.d = daemon
        self.batches = self.submitted = self.granted = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seg = Segment.attach(self.d.shm)
        hooks = HooksClient(self.d.hooks)
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                rid, bid = f"{self.d.node}-r{n}", f"{self.d.node}-b{n}"
                try:
                    hooks.register_request(rid, deadline=time.time() + 10, prompt_tokens=256)
                    hooks.batch_formed(bid, [rid], compute_s=0.005, traffic={"eth0": {rid: 1e6}})
                    hooks.layer_begin(bid, 0)
                except Exception as exc:  # noqa: BLE001 - hooks fail open; anything raised is a failure
                    self.errors.append(f"hooks: {exc!r}")
                msg = seg.alloc_msg_id()
                if not seg.push_event(EventKind.SUBMIT, msg, request_key(rid), 1 << 20, Stage.P2D, 0, 1):
                    self.errors.append(f"ring full at message {msg}")
                    continue
                self.submitted += 1
                deadline = time.monotonic() + 10
                while not ((p := seg.get_permit(msg)) is not None and p.gate == Gate.OPEN):
                    if time.monotonic() > deadline:
                        self.errors.append(f"message {msg} of {rid} never granted")
                        break
                    time.sleep(0.001)
                else:
                    self.granted += 1
                seg.push_event(EventKind.COMPLETION, msg, request_key(rid), 1 << 20, Stage.P2D, 0, 1)
                try:
                    hooks.layer_end(bid, 0, last=True)
                    hooks.request_done(rid)
                    self.batches += 1
                except Exception as exc:  # noqa: BLE001
                    self.errors.append(f"hooks: {exc!r}")
                time.sleep(0.01)
        finally:
            hooks.close()
            seg.close(unlink=False)

    def join(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def cluster(tmp_path):
    coord = CoordinatorProcess(tmp_path, heartbeat=0.2, dead_after=1.0).start()
    daemons: list[DaemonProc] = []
    try:
        for node in ("n0", "n1"):
            daemons.append(DaemonProc(tmp_path, node=node, coordinator=coord.address,
                                      config={"heartbeat_s": 0.2, "window_bytes": 0}))
        yield coord, daemons
    finally:
        for d in daemons:
            d.cleanup()
        if coord.proc is not None and coord.proc.poll() is None:
            coord.proc.kill()
            coord.proc.wait()


def test_sigterm_coordinator_under_reports_exits_0_daemons_continue_locally(cluster):
    coord, daemons = cluster
    wait_for(lambda: sorted(d.node for d in request_status(coord.address, timeout_s=1.0).daemons if d.alive)
             == ["n0", "n1"], timeout=20, what="both daemons in the coordinator's view")
    streams = [Stream(d) for d in daemons]
    try:
        # the coordinator is receiving the stream: batch reports from both daemons
        wait_for(lambda: all(s.batches >= 20 for s in streams), timeout=30, what="batches reported")
        wait_for(lambda: coord.metrics().get("laxflow_coordinator_frames_total{type=batch_arrival}", 0) >= 20,
                 timeout=10, what="the coordinator counting arrivals")
        assert coord.stop() == 0, coord.log.read_text()[-3000:]  # SIGTERM in the middle of the stream
        for d in daemons:
            wait_for(lambda d=d: f'laxflow_daemon_coordinator_connected{{node="{d.node}"}} 0.0' in d.metrics(),
                     timeout=15, what=f"{d.node} noticing the coordinator is gone")
            assert f'laxflow_daemon_mode{{mode="local",node="{d.node}"}} 1.0' in d.metrics()
        after = [s.granted for s in streams]
        wait_for(lambda: all(s.granted >= a + 20 for s, a in zip(streams, after)), timeout=30,
                 what="daemons granting locally after the coordinator left")
    finally:
        for s in streams:
            s.join()
    for s, d in zip(streams, daemons):
        assert s.errors == [], s.errors
        assert s.granted == s.submitted > 0  # every message announced was granted: none lost
        wait_for(lambda d=d: f'laxflow_daemon_live_messages{{node="{d.node}"}} 0.0' in d.metrics(),
                 what=f"{d.node}: every message completed")
        assert d.proc.poll() is None  # the daemons outlived the coordinator
        assert d.terminate() == 0, "".join(d.log)
    assert "Traceback" not in coord.log.read_text()
