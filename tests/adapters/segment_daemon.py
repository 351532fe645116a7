"""A test acting as the node daemon through the real shared-memory segment.

It creates a uniquely named segment, beats on a thread, drains events on
another and hands each SUBMIT to ``decide(event) -> (gate, level, dscp) | None``
(None: leave the message waiting; the test opens it later with ``open``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from laxflow.protocol.shm import EventKind, Gate, Segment

# Staleness while the test means the daemon to live: its beat is a thread of
# the test process, which a garbage collection or a loaded machine can stop
# for a second or more.  hang() and close() set DEAD_NS, after which shims
# and gates see the daemon gone.
LIVE_NS = 120_000_000_000
DEAD_NS = 200_000_000


class SegmentDaemon:
    def __init__(self, decide=None, beat_s: float = 0.005, name: str | None = None) -> None:
        self.name = name or f"/lxf-adapters-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.seg = Segment.create(self.name, stale_ns=LIVE_NS)
        self.decide = decide or (lambda ev: (Gate.OPEN, 0, 0))
        self.events: list[dict] = []
        self.beating = True
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.seg.heartbeat()
        self._threads = [threading.Thread(target=self._beat, args=(beat_s,), daemon=True),
                         threading.Thread(target=self._drain, daemon=True)]
        for t in self._threads:
            t.start()

    def _beat(self, beat_s: float) -> None:
        while not self._stop.is_set():
            if self.beating:
                self.seg.heartbeat()
            time.sleep(beat_s)

    def _drain(self) -> None:
        while not self._stop.is_set():
            for row in self.seg.drain_events():
                ev = {k: int(row[k]) for k in ("kind", "pid", "msg_id", "request_id", "bytes", "stage", "layer")}
                with self._lock:
                    self.events.append(ev)
                if ev["kind"] == EventKind.SUBMIT:
                    verdict = self.decide(ev)
                    if verdict is not None:
                        self.seg.set_permit(ev["msg_id"], *verdict)
            time.sleep(0.0005)

    def hang(self) -> None:
        """The daemon stops beating: seen dead DEAD_NS after its last beat."""
        self.seg.stale_ns = DEAD_NS
        self.beating = False

    def open(self, msg_id: int, level: int = 0, dscp: int = 0) -> None:
        self.seg.set_permit(msg_id, Gate.OPEN, level, dscp)

    def of_kind(self, kind: int) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]

    def wait_for(self, pred, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if pred(list(self.events)):
                    return
            time.sleep(0.002)
        raise AssertionError(f"daemon: condition not met within {timeout}s; events {self.events}")

    def close(self) -> None:
        """The daemon exits and removes its segment; processes still mapping
        it see it dead DEAD_NS after its last beat."""
        self.seg.stale_ns = DEAD_NS
        self._stop.set()
        for t in self._threads:
            t.join()
        self.seg.close()
