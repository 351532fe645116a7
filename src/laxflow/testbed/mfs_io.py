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

import contextlib
import os
import socket
import threading
import time
from concurrent.futures import Future
from typing import Callable

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.adapters.sockets import wait_drained
from laxflow.hooks.client import HooksClient
from laxflow.protocol.shm import Permit, TagKind, TagValue


RX_PORT = "eth0-rx"  # the daemons' port for bytes arriving at the host (a NIC port is full duplex)
RX_HANDLE = 1 << 32  # handle of the reads a socket initiates: fd + RX_HANDLE, bound to RX_PORT


class DaemonIO:
    """One per worker process; methods are called from any of its threads."""

    def __init__(self, shm: str, hooks: str) -> None:
        # Workers run released transfers; a read holds one until its bytes are in, so there are enough
        # for every layer's read of a request and the writes in flight beside them.
        self.gate = PermitGate(GateConfig(shm_name=shm, workers=16))
        self._bound: set[int] = set()  # read handles bound to RX_PORT
        self._class: dict[int, int] = {}  # fd -> DSCP of its last message
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

    def _permitted(self, stage: int, t0: float, permit: Permit | None) -> None:
        with self._lock:
            self.waits.setdefault(stage, []).append(time.monotonic() - t0)
            if permit is not None:
                key = f"s{stage}:{permit.dscp}"
                self.dscp_used[key] = self.dscp_used.get(key, 0) + 1

    def submit_send(self, sock: socket.socket, data: bytes, request: int, stage: int, layer: int,
                    lock: threading.Lock | None = None) -> Future:
        """Send ``data`` on ``sock`` as one message of (request, stage, layer) once permitted; returns at once.

        ``lock`` keeps concurrent messages on one connection whole. The socket
        flow tag tells the shim the message and its permit's class before
        the first byte leaves; the future is done once the bytes are sent.
        """
        fd = sock.fileno()
        t0 = time.monotonic()

        def run(permit: Permit | None) -> None:
            self._permitted(stage, t0, permit)
            with lock or contextlib.nullcontext():
                if permit is not None:
                    self._switch_class(fd, permit.dscp)
                    self.gate.write_tag(TagKind.SOCKET, fd, TagValue(permit.msg_id, request, len(data), stage, layer,
                                                                     permit.dscp))
                sock.sendall(data)

        return self.gate.submit(run, request, stage, layer, len(data), handle=fd)

    def send(self, sock: socket.socket, data: bytes, request: int, stage: int, layer: int) -> None:
        """:meth:`submit_send` and wait until the bytes are sent."""
        self.submit_send(sock, data, request, stage, layer).result()

    def submit_read(self, nbytes: int, request: int, stage: int, layer: int, fd: int,
                    ask: Callable[[int], None], arrived: threading.Event) -> Future:
        """A read this host initiates (one-sided, like an RDMA READ): gated here, on the ingress port.

        The message goes to this host's daemon, which knows the request's
        layer progress (RLI). Once permitted, ``ask(dscp)`` sends the read
        request carrying the permit's class (-1: none) to the responder, whose
        shim puts the bytes in that class (:meth:`mark`); the message is
        complete when the caller's receiver sets ``arrived``. ``fd`` is the
        connection the bytes arrive on. Returns at once.
        """
        handle = RX_HANDLE + fd
        with self._lock:
            fresh = handle not in self._bound
            self._bound.add(handle)
        if fresh:
            self.hooks().bind(os.getpid(), handle, RX_PORT)
        t0 = time.monotonic()

        def run(permit: Permit | None) -> None:
            self._permitted(stage, t0, permit)
            ask(permit.dscp if permit is not None else -1)
            arrived.wait()

        return self.gate.submit(run, request, stage, layer, nbytes, handle=handle)

    def mark(self, sock: socket.socket, nbytes: int, request: int, stage: int, layer: int, dscp: int) -> None:
        """Responder side of :meth:`read`: the next ``nbytes`` on ``sock`` go in the initiator's class."""
        if dscp >= 0:
            self._switch_class(sock.fileno(), dscp)
            self.gate.mark(TagKind.SOCKET, sock.fileno(), request, stage, layer, nbytes, dscp)

    def _switch_class(self, fd: int, dscp: int) -> None:
        """Before a message in class ``dscp`` on ``fd``: if the class changes, let the previous bytes drain.

        One class in flight per connection (see :func:`laxflow.adapters.sockets.wait_drained`); the caller
        holds the connection's lock, so messages queue behind the drain in their order.
        """
        if self._class.get(fd, dscp) != dscp:
            wait_drained(fd)
        self._class[fd] = dscp

    def close(self) -> None:
        self.gate.close()
        with self._lock:
            for c in self._clients:
                c.close()
