"""The contention scenario's transfers under the node daemon ("on" mode).

Used by :mod:`laxflow.testbed.worker` in a host namespace whose node daemon
serves segment ``shm`` and hooks address ``hooks``; the worker runs under the
preloaded shim attached to that segment. Each stage's transfer is one
message: :class:`laxflow.adapters.gate.PermitGate` submits it (SUBMIT event),
waits for the daemon's permit off the caller's thread, and on a gate worker
thread writes the socket's flow tag (message id, stage, layer, the permit's
DSCP) so the *shim* sets the class on the wire before the bytes leave, sends,
and reports COMPLETION. Request registration, batches and layer boundaries go
through :class:`laxflow.hooks.client.HooksClient` (one per thread: ZeroMQ
sockets are not thread-safe). Everything fails open: without a daemon the
bytes still flow, in the connection's static class.
"""

from __future__ import annotations

import socket
import threading
import time

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.hooks.client import HooksClient
from laxflow.protocol.shm import Permit, TagKind, TagValue


class DaemonIO:
    """One per worker process; methods are called from any of its threads."""

    def __init__(self, shm: str, hooks: str) -> None:
        self.gate = PermitGate(GateConfig(shm_name=shm, workers=4))
        self._hooks_address = hooks
        self._local = threading.local()
        self._clients: list[HooksClient] = []
        self._lock = threading.Lock()
        self.dscp_used: dict[str, int] = {}  # "s<stage>:<permit DSCP>" -> messages, for the run's report
        self.waits: dict[int, list[float]] = {}  # stage -> seconds from submit to permit

    def hooks(self) -> HooksClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = HooksClient(self._hooks_address, name="testbed")
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def send(self, sock: socket.socket, data: bytes, request: int, stage: int, layer: int) -> None:
        """Send ``data`` on ``sock`` as one message of (request, stage, layer); returns once sent."""
        fd = sock.fileno()
        t0 = time.monotonic()

        def run(permit: Permit | None) -> None:
            with self._lock:
                self.waits.setdefault(stage, []).append(time.monotonic() - t0)
            if permit is not None:
                self.gate.write_tag(TagKind.SOCKET, fd, TagValue(permit.msg_id, request, len(data), stage, layer,
                                                                 permit.dscp))
                with self._lock:
                    key = f"s{stage}:{permit.dscp}"
                    self.dscp_used[key] = self.dscp_used.get(key, 0) + 1
            sock.sendall(data)

        self.gate.submit(run, request, stage, layer, len(data), handle=fd).result()

    def close(self) -> None:
        self.gate.close()
        with self._lock:
            for c in self._clients:
                c.close()
