"""Connecting to the coordinator: addresses, sockets, CURVE, one status query.

Who uses it: the node daemon (:class:`CoordinatorLink`, on its loop thread),
``laxflow status`` (:func:`request_status`), tests and benchmarks. The
coordinator's own sockets are built by :mod:`laxflow.coordinator.server`
from the same :class:`Endpoints`.

Addresses: the coordinator is named by its ROUTER address, ``tcp://HOST:PORT``
or ``ipc:///path``. Its PUB socket is at ``tcp://HOST:PORT+1`` (or
``ipc:///path.pub``): a daemon needs only the one address.

Example (a daemon's loop)::

    link = CoordinatorLink("tcp://head:5555", sender="node1", keys=ClientKeys.load("/etc/laxflow/keys"))
    link.send(messages.Hello("node1", "start", ports, ()))
    for env in link.receive(timeout_ms=100):   # Welcome, ResyncRequest, Decision
        ...
    link.close()
"""

from __future__ import annotations

import ipaddress
import socket as pysocket
import time
from dataclasses import dataclass
from typing import Any

import zmq

from laxflow.coordinator.keys import ClientKeys
from laxflow.errors import UserError
from laxflow.protocol import messages as m
from laxflow.protocol.wire import (
    SOCKET_MAX_BYTES,
    DropCounter,
    DropReason,
    DuplicateFilter,
    Envelope,
    ProtocolError,
    decode,
    encode,
)


# ZeroMQ socket-monitor events of a handshake, by the kind the daemon counts: "auth" (the coordinator's
# authenticator refused our CURVE key), "protocol" (security mismatch: one side has CURVE, the other not),
# "other" (broken off without a reason: what a wrong coordinator public key gives).
HANDSHAKE_EVENTS = {
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "ok",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other",
}


@dataclass(frozen=True)
class Endpoints:
    """The coordinator's two sockets, derived from its ROUTER address."""

    router: str
    pub: str
    host: str  # "" for ipc

    @classmethod
    def parse(cls, address: str) -> "Endpoints":
        """UserError naming the address unless it is tcp://HOST:PORT or ipc://PATH."""
        if address.startswith("ipc://") and len(address) > len("ipc://"):
            return cls(address, address + ".pub", "")
        if not address.startswith("tcp://"):
            raise UserError(f"coordinator address {address!r}: expected tcp://HOST:PORT or ipc://PATH")
        host, sep, port = address[len("tcp://"):].rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65534:
            raise UserError(f"coordinator address {address!r}: expected tcp://HOST:PORT with PORT 1..65534 (PUB uses PORT+1)")
        return cls(address, f"tcp://{host}:{int(port) + 1}", host.strip("[]"))

    @property
    def loopback(self) -> bool:
        """True when only this machine can reach it (ipc, 127/8, ::1, localhost)."""
        if not self.host:
            return True
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a name or an interface: resolve names, treat "*" and interfaces as exposed
            if self.host == "*":
                return False
            try:
                return all(ipaddress.ip_address(a[4][0]).is_loopback for a in pysocket.getaddrinfo(self.host, None))
            except (OSError, ValueError):
                return False


def client_socket(ctx: zmq.Context, kind: int, keys: ClientKeys | None) -> zmq.Socket:
    """A socket with laxflow's options: no linger, bounded queues, the frame cap, CURVE."""
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.maxmsgsize = SOCKET_MAX_BYTES
    sock.sndhwm = sock.rcvhwm = 10000
    if keys is not None:
        keys.apply(sock)
    return sock


class CoordinatorLink:
    """A daemon's connection: DEALER to the ROUTER, SUB to the PUB.

    One thread (the daemon's loop). ZeroMQ reconnects by itself; the
    coordinator asks for a resync when it sees a daemon it does not know, so
    the daemon only has to answer :class:`~laxflow.protocol.messages.ResyncRequest`
    with a full-state Hello. Bad frames are counted in ``drops`` and skipped.

    With ``monitor``, each socket's handshakes are watched (a ZeroMQ socket
    monitor): :meth:`handshake_events` says which succeeded or failed, and
    :meth:`reconnect` starts a socket over (ZeroMQ itself never retries
    after the coordinator refused the handshake).
    """

    def __init__(
        self,
        address: str,
        sender: str,
        keys: ClientKeys | None = None,
        context: zmq.Context | None = None,
        subscribe: bool = True,
        monitor: bool = False,
    ) -> None:
        self.endpoints = Endpoints.parse(address)
        self.sender = sender
        self._ctx = context or zmq.Context.instance()
        self.dealer = client_socket(self._ctx, zmq.DEALER, keys)
        self.sub: zmq.Socket | None = None
        if subscribe:
            self.sub = client_socket(self._ctx, zmq.SUB, keys)
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        # Monitors before connect, or the first handshake's events are missed.
        self._monitors: list[tuple[zmq.Socket, zmq.Socket, str]] = []
        if monitor:
            mask = 0
            for event in HANDSHAKE_EVENTS:
                mask |= event
            for sock, endpoint in ((self.dealer, self.endpoints.router), (self.sub, self.endpoints.pub)):
                if sock is not None:
                    self._monitors.append((sock, sock.get_monitor_socket(mask), endpoint))
        self.dealer.connect(self.endpoints.router)
        self.poller = zmq.Poller()
        self.poller.register(self.dealer, zmq.POLLIN)
        if self.sub is not None:
            self.sub.connect(self.endpoints.pub)
            self.poller.register(self.sub, zmq.POLLIN)
        self.drops = DropCounter()
        self.send_dropped = 0  # messages not sent because the coordinator's queue was full
        self._dups = DuplicateFilter()

    @property
    def sockets(self) -> list[zmq.Socket]:
        """For a caller's own zmq.Poller."""
        return [s for s in (self.dealer, self.sub) if s is not None]

    def send(self, msg: Any) -> bool:
        """Queue ``msg`` for the coordinator without blocking; False if the queue is full."""
        try:
            self.dealer.send(encode(msg, self.sender), zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.send_dropped += 1
            return False

    def receive(self, timeout_ms: int = 0) -> list[Envelope]:
        """Every frame waiting (after up to ``timeout_ms`` for the first), decoded."""
        out: list[Envelope] = []
        if not dict(self.poller.poll(timeout_ms)):
            return out
        for sock in self.sockets:
            while True:
                try:
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                env = self._decode(parts)
                if env is not None:
                    out.append(env)
        return out

    def _decode(self, parts: list[bytes]) -> Envelope | None:
        if len(parts) != 1:
            self.drops.add(DropReason.MALFORMED)
            return None
        try:
            env = decode(parts[0])
        except ProtocolError as exc:
            self.drops.add(exc.reason)
            return None
        if self._dups.seen(env):
            self.drops.add(DropReason.DUPLICATE)
            return None
        return env

    def handshake_events(self) -> list[tuple[str, zmq.Socket]]:
        """Handshakes finished since the last call: (kind, socket), kind one of ``HANDSHAKE_EVENTS``' values."""
        from zmq.utils.monitor import recv_monitor_message

        out: list[tuple[str, zmq.Socket]] = []
        for sock, mon, _ in self._monitors:
            while mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # a flag read: no exception on the loop's idle pass
                kind = HANDSHAKE_EVENTS.get(recv_monitor_message(mon, zmq.NOBLOCK)["event"])
                if kind is not None:
                    out.append((kind, sock))
        return out

    def reconnect(self, sock: zmq.Socket) -> None:
        """Drop ``sock``'s connection and connect again (a new handshake); same socket object."""
        for s, _, endpoint in self._monitors:
            if s is sock:
                try:
                    sock.disconnect(endpoint)
                except zmq.ZMQError:
                    pass  # ZeroMQ already dropped it
                sock.connect(endpoint)

    def close(self) -> None:
        for sock, mon, _ in self._monitors:
            sock.disable_monitor()
            mon.close(linger=0)
        self._monitors = []
        for s in self.sockets:
            s.close(linger=0)


def request_status(
    address: str, keys: ClientKeys | None = None, timeout_s: float = 2.0, detail: bool = True
) -> m.StatusResponse:
    """Ask the coordinator at ``address`` for its status; UserError if it does not answer in time."""
    link = CoordinatorLink(address, sender=f"status-{pysocket.gethostname()}", keys=keys, subscribe=False)
    try:
        link.send(m.StatusRequest(detail))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for env in link.receive(timeout_ms=max(int(left * 1000), 1)):
                if isinstance(env.body, m.StatusResponse):
                    return env.body
        hint = "" if keys else " (if it requires CURVE, pass --curve-keys DIR)"
        raise UserError(f"no coordinator answered at {address} within {timeout_s:g} s{hint}")
    finally:
        link.close()
