"""Helpers of the control-plane tests: a coordinator process, a daemon-side test client.

The coordinator runs as a real ``laxflow coordinator`` process on loopback
ports picked free for each test (other helpers run tests at the same time).
:class:`TestDaemon` speaks the protocol the way a node daemon must: Hello
on start, heartbeats, arrivals and departures, a full-state Hello when the
coordinator asks for a resync; it runs on its own thread.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from laxflow.coordinator.client import CoordinatorLink, request_status
from laxflow.coordinator.keys import ClientKeys
from laxflow.errors import UserError
from laxflow.protocol import messages as m

LAXFLOW = str(Path(sys.executable).parent / "laxflow")
GB = 1e9


def free_port(pair: bool = False) -> int:
    """A free loopback TCP port (and the next one free too when ``pair``)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if not pair:
                return port
            if port >= 65534:
                continue
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair on loopback")


class CoordinatorProcess:
    """``laxflow coordinator`` on a free loopback port; restartable on the same ports."""

    def __init__(self, tmp: Path, keys: Path | None = None, heartbeat: float = 0.2, dead_after: float = 1.0,
                 drop_budget: int = 1) -> None:
        self.port = free_port(pair=True)
        self.metrics_port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.keys = keys
        self.args = [LAXFLOW, "coordinator", "--bind", self.address, "--metrics-port", str(self.metrics_port),
                     "--heartbeat", str(heartbeat), "--dead-after", str(dead_after), "--drop-budget", str(drop_budget),
                     "--log-level", "warning"]
        if keys:
            self.args += ["--curve-keys", str(keys)]
        self.log = tmp / f"coordinator-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "CoordinatorProcess":
        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        keys = ClientKeys.load(self.keys) if self.keys else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            try:
                request_status(self.address, keys=keys, timeout_s=0.5)
                return
            except UserError:
                continue
        raise TimeoutError(f"coordinator did not answer: {self.log.read_text()}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)

    def metrics(self) -> dict[str, float]:
        """Sample name{labels} -> value from /metrics."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out


class TestDaemon:
    """A daemon-side protocol client on its own thread (test stand-in for ``laxflow daemon``)."""

    __test__ = False  # not a pytest class

    def __init__(self, address: str, node: str, ports: list[str], keys: ClientKeys | None = None,
                 heartbeat: float = 0.2) -> None:
        self.address, self.node, self.keys, self.heartbeat = address, node, keys, heartbeat
        self.ports = tuple(m.PortInfo(p, GB) for p in ports)
        self.batches: dict[str, m.BatchInfo] = {}
        self.decisions: list[m.Decision] = []
        self.welcomes: list[m.Welcome] = []
        self.resyncs = 0
        self._todo: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"testdaemon-{node}", daemon=True)
        self._thread.start()

    def arrive(self, info: m.BatchInfo) -> None:
        self._todo.put(("arrive", info))

    def depart(self, batch_id: str) -> None:
        self._todo.put(("depart", batch_id))

    def last_decision(self) -> m.Decision | None:
        with self._lock:
            return self.decisions[-1] if self.decisions else None

    def wait_for(self, predicate, timeout: float = 10.0) -> m.Decision:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = self.last_decision()
            if d is not None and predicate(d):
                return d
            time.sleep(0.02)
        raise TimeoutError(f"{self.node}: no matching decision; last {self.last_decision()}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _hello(self, link: CoordinatorLink, reason: str) -> None:
        link.send(m.Hello(self.node, reason, self.ports, tuple(self.batches.values())))

    def _run(self) -> None:
        link = CoordinatorLink(self.address, self.node, keys=self.keys)
        self._hello(link, "start")
        seq = 0
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                while True:
                    try:
                        op, arg = self._todo.get_nowait()
                    except queue.Empty:
                        break
                    if op == "arrive":
                        self.batches[arg.id] = arg
                        link.send(m.BatchArrival(self.node, arg))
                    else:
                        self.batches.pop(arg, None)
                        link.send(m.BatchDeparture(self.node, arg))
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.heartbeat
                    seq += 1
                    last = self.last_decision()
                    link.send(m.Heartbeat(self.node, seq, len(self.batches), "coordinated" if last else "local",
                                          last.coordinator_id if last else "", last.seq if last else -1,
                                          (m.QueueDepth(self.ports[0].port, 1, len(self.batches), 0),)))
                for env in link.receive(timeout_ms=20):
                    if isinstance(env.body, m.ResyncRequest):
                        self.resyncs += 1
                        self._hello(link, "resync")
                    elif isinstance(env.body, m.Welcome):
                        self.welcomes.append(env.body)
                    elif isinstance(env.body, m.Decision):
                        with self._lock:
                            self.decisions.append(env.body)
        finally:
            link.close()


def request(rid: str, deadline: float, nbytes: float, src: str, dst: str) -> m.RequestInfo:
    return m.RequestInfo(rid, deadline, 1000, 0, (m.Transfer(src, dst, nbytes),))
