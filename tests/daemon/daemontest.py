"""Helpers of the daemon tests: a real ``laxflow daemon`` process on a unique segment and ipc path."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from laxflow.protocol.shm import Segment, SegmentError

LAXFLOW = [str(Path(sys.executable).with_name("laxflow"))]
_names = itertools.count()


class DaemonProc:
    """One ``laxflow daemon`` subprocess; stderr collected in ``log``."""

    def __init__(self, tmp: Path, node: str = "n1", ports=(("eth0", 100),), coordinator: str | None = None,
                 extra: list[str] | None = None, shm: str | None = None, config: dict | None = None) -> None:
        self.node = node
        self.shm = shm or f"/lxf-dtest-{os.getpid()}-{next(_names)}"
        self.hooks = f"ipc://{tmp}/hooks-{node}-{self.shm.strip('/')}.sock"
        ports_file = tmp / f"ports-{node}.json"
        ports_file.write_text(json.dumps({"ports": [{"name": n, "gbps": g} for n, g in ports]}))
        args = [*LAXFLOW, "daemon", "--node", node, "--shm", self.shm, "--ports", str(ports_file),
                "--metrics-port", "0", "--hooks", self.hooks]
        if coordinator:
            args += ["--coordinator", coordinator]
        if config is not None:
            cfg = tmp / f"config-{node}.json"
            cfg.write_text(json.dumps(config))
            args += ["--config", str(cfg)]
        self.args = args + (extra or [])
        self.log: list[str] = []
        self.metrics_port: int | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"metrics on port (\d+)", line)
                if m:
                    self.metrics_port = int(m.group(1))
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30):
            self.proc.kill()
            raise AssertionError("daemon did not start:\n" + "".join(self.log))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                seg = Segment.attach(self.shm)
                live = seg.live()
                seg.close(unlink=False)
                if live:
                    return
            except SegmentError:
                pass
            time.sleep(0.01)
        raise AssertionError("daemon segment never went live:\n" + "".join(self.log))

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def terminate(self, timeout: float = 10) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        Segment.unlink_name(self.shm)


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")
