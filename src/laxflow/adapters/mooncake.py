"""Mooncake's ``TransferEngine`` with laxflow's keywords: gated, tagged, reported.

:class:`TransferEngine` has the calls of ``mooncake.engine.TransferEngine``
(anything it does not wrap, such as ``register_memory`` or
``get_rpc_port``, goes straight to the inner engine) and adds keyword-only
``request``, ``stage``, ``layer`` and ``deadline`` to every transfer call.
Each transfer becomes one laxflow message:

1. the caller's thread pushes SUBMIT (request, stage, layer, bytes) into the
   daemon's segment and gets a handle at once (:mod:`laxflow.adapters.gate`);
2. a waiter thread sees the daemon open its gate; a worker thread then marks
   the peer's connections with the permit's class (TCP: ``IP_TOS`` on
   Mooncake's sockets to that peer and a socket flow tag for the shim; RDMA:
   QP flow tags, see ``MooncakeAdapterConfig.qp_lookup``), starts the
   transfer with Mooncake's asynchronous batch call and polls it;
3. COMPLETION is pushed and the handle completes.

The synchronous calls (``transfer_sync_*``, ``batch_transfer_sync_*``) block
their caller as Mooncake's do; the asynchronous ones
(``batch_transfer_async_*``, ``transfer_submit_write``) return a handle that
``transfer_check_status`` / ``get_batch_transfer_status`` accept, exactly as
Mooncake's batch ids; :meth:`TransferEngine.submit` returns a Future.

*Finding Mooncake's sockets.*  Mooncake's TCP transport opens its data
connections on its own threads, during the first transfer to a peer, and
keeps them.  The wrapper notes the process's sockets before its first
transfer to a target ``host:rpc_port``, sends that transfer's first
``PRIME_BYTES`` alone, and takes the connection that appeared meanwhile
towards the target's host (not to its RPC port) as Mooncake's: its remote
port is the peer's TcpTransport port.  From then on the peer's connections
are the sockets to (or, for a peer in this process, from) that
``host:port``; they are marked, then the rest of the transfer is sent, and
later transfers are marked before they start (the set is looked up again
when a socket is gone or ``RESCAN_S`` has passed).  Mooncake
multiplexes concurrent transfers to one peer over those connections, so a
connection carries the most urgent (lowest level) class among the transfers
in flight to that peer.  The data of a READ is sent by the peer's socket:
its class on the wire is the peer's (in one process, as in the tests, both
ends are marked).

*When a transfer is done.*  Mooncake reports a TCP WRITE complete once its
bytes are in the kernel's socket buffer, up to several megabytes before the
peer has them.  The wrapper waits until what was queued on the peer's
connections at that moment is acknowledged (``SIOCOUTQ`` and TCP_INFO's
acknowledged byte count, at most ``drain_timeout_s``) before it reports
COMPLETION: the daemon's permit rule counts a message's bytes as
unfinished until then, so a lower-level transfer gated behind it does not
start while its tail still occupies the link, and the next transfer's class
change does not re-mark those bytes (a TCP packet leaves, or is resent, with
the socket's class at that moment).  Before a connection moves to a *more*
urgent class the wrapper likewise waits (at most ``raise_wait_s``) for its
earlier bytes: packets of one connection in two strict-priority queues
arrive out of order (duplicate ACKs, spurious retransmits).  A move to a
less urgent class cannot reorder and does not wait; nor does a raise while
another transfer to the peer runs (its connection would not drain before
it ends).

Threads: callers any; one waiter thread and ``GateConfig.workers`` worker
threads per wrapper.  Fails open with the gate: no daemon, no marks.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import count
from typing import Any, Mapping

from laxflow.adapters.gate import PermitGate
from laxflow.adapters.mooncake_config import MooncakeAdapterConfig, apply_glog_level
from laxflow.adapters.sockets import TcpSocket, set_dscp, socket_inodes, tcp_sockets, unacked_bytes
from laxflow.protocol.shm import Gate, Permit, Stage, TagKind, TagValue

_READ, _WRITE = "read", "write"
RESCAN_S = 1.0  # at most this long before a peer's connections are looked up again
PRIME_BYTES = 4096  # first transfer to a new peer: sent alone to open and learn the connection
NEW_CONN_WATCH_S = 0.05  # after a submit that overlaps another transfer to the peer: look for a new connection
RECORDS = 4096  # TransferEngine.records keeps the last this many transfers


@dataclass(frozen=True)
class TransferRecord:
    """One finished transfer, as :attr:`TransferEngine.records` keeps it.

    ``msg_id``/``level``/``dscp``: its permit (0/-1/-1 when it failed open);
    ``permitted``/``moved``/``done``: ``time.monotonic()`` when the worker
    started it, when Mooncake reported it finished, and when it completed
    (for a WRITE: its bytes acknowledged, or ``drained`` False);
    ``status``: 0 or Mooncake's error.
    """

    op: str
    target: str
    request: int
    stage: int
    layer: int
    nbytes: int
    msg_id: int
    level: int
    dscp: int
    permitted: float
    moved: float
    done: float
    status: int
    drained: bool


class _PeerSockets:
    """Mooncake's known connections to one target, and the classes in flight there."""

    def __init__(self, before: set[int]) -> None:
        self.before = before  # socket inodes of the process before the first transfer here
        self.data_port: int | None = None  # the peer's TcpTransport port, learned at first contact
        self.sockets: list[TcpSocket] = []
        self.inflight: dict[int, int] = {}  # token -> (level << 8 | dscp)
        self.scanned_at = 0.0  # time.monotonic() of the last scan
        self.first_contact: set[int] = set()  # tokens of transfers that started before data_port was known
        self.marked: int | None = None  # (level << 8 | dscp) last put on the connections


class TransferEngine:
    """The wrapper; see the module docstring.  ``engine`` defaults to a new Mooncake engine."""

    def __init__(
        self, engine: Any = None, config: MooncakeAdapterConfig | None = None, protocol: str = ""
    ) -> None:
        """``protocol``: 'tcp' or 'rdma' when ``engine`` is already initialized."""
        if engine is None:
            from mooncake.engine import TransferEngine as MooncakeEngine

            apply_glog_level()
            engine = MooncakeEngine()
        self._engine = engine
        self.config = config or MooncakeAdapterConfig.from_env()
        self._gate = PermitGate(self.config.gate)
        self._protocol = protocol
        # sockets that existed before Mooncake's: reset by initialize(); an
        # engine handed over already initialized has no known history
        self._baseline: set[int] = set()
        self._peers: dict[str, _PeerSockets] = {}
        self._peers_lock = threading.Lock()
        self._handles: dict[int, Future] = {}
        self._handle_ids = count(1)
        self._tokens = count(1)
        self._deadlines_sent: set[int] = set()
        self.records: deque[TransferRecord] = deque(maxlen=RECORDS)  # appended by worker threads
        self.stats = {"drain_timeouts": 0, "raise_waits": 0, "raise_wait_timeouts": 0}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never recurse through a half-built wrapper
            raise AttributeError(name)
        return getattr(self._engine, name)

    @property
    def gate(self) -> PermitGate:
        return self._gate

    # ------------------------------------------------------------ setup

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        self._protocol = protocol
        self._baseline = set(socket_inodes())
        return self._engine.initialize(local_hostname, metadata_server, protocol, device_name)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type) -> int:
        self._protocol = protocol
        self._baseline = set(socket_inodes())
        return self._engine.initialize_ext(local_hostname, metadata_server, protocol, device_name, metadata_type)

    def close(self) -> None:
        """Release waiting transfers (fail open), finish running ones, detach from the daemon."""
        self._gate.close()

    # ------------------------------------------------------- the futures API

    def submit(
        self,
        op: str,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
        *,
        request: int = 0,
        stage: int | None = None,
        layer: int = 0,
        deadline: float | None = None,
        handle: int = 0,
        segments: Mapping[int, str] | None = None,
    ) -> Future:
        """One message of ``op`` ('read' or 'write'); the Future gives 0 or Mooncake's error.

        ``request``: the request's 63-bit id in shared memory (the hooks API's
        ``request_key``).  ``stage`` defaults to reuse (1) for reads and p2d (3)
        for writes.  ``deadline``: the request's TTFT deadline, in the units of
        the hooks API's ``register_request`` (handed to ``on_deadline``).
        ``handle``: the message's handle for the daemon (which port it is
        counted on, bound through the hooks API's ``bind``; 0: the process's
        default port), e.g. a one-sided read counted on the host's receive port.
        ``segments``: DSCP -> target segment serving the same memory in that
        class; the transfer goes to the one of its permit's DSCP (else to
        ``target_hostname``).  A READ's bytes are sent by the target's sockets,
        which the initiator cannot mark: a target that serves one segment per
        class (its listening socket's class, inherited by every connection it
        accepts) lets the initiator pick the class per transfer, one-sided,
        as an RDMA READ's class is the responder QP's.
        """
        if op not in (_READ, _WRITE):
            raise ValueError(f"op: expected 'read' or 'write', got {op!r}")
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)) or not buffers:
            raise ValueError("buffers, peer_buffer_addresses and lengths: expected equal, non-zero lengths")
        if stage is None:
            stage = Stage.REUSE if op == _READ else Stage.P2D
        if stage not in (Stage.REUSE, Stage.COLLECTIVE, Stage.P2D, Stage.NONE):
            raise ValueError(f"stage: expected 0..3, got {stage!r}")
        if request < 0 or layer < 0:
            raise ValueError(f"request and layer: expected integers >= 0, got {request}, {layer}")
        if deadline is not None and request not in self._deadlines_sent:
            self._deadlines_sent.add(request)
            if self.config.on_deadline is not None:
                self.config.on_deadline(request, float(deadline))
        nbytes = int(sum(lengths))

        def run(permit: Permit | None) -> int:
            if permit is None and int(stage) in self.config.static_dscp:
                dscp = self.config.static_dscp[int(stage)]
                permit = Permit(0, Gate.OPEN, 63 - dscp, dscp)  # static class: a higher DSCP is more urgent
            target = target_hostname
            if segments and permit is not None:
                target = segments.get(permit.dscp, target_hostname)
            return self._execute(op, target, buffers, peer_buffer_addresses, lengths, transport_hint,
                                 permit, request, int(stage), layer, nbytes)

        return self._gate.submit(run, request, int(stage), layer, nbytes, handle=handle)

    # --------------------------------------------------- Mooncake's calls

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length, transport_hint="", **tags) -> int:
        return self.submit(_READ, target_hostname, [buffer], [peer_buffer_address], [length], transport_hint, **tags).result()

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint="", **tags) -> int:
        return self.submit(_WRITE, target_hostname, [buffer], [peer_buffer_address], [length], transport_hint, **tags).result()

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode, notify=None,
                      transport_hint="", **tags) -> int:
        if notify is not None:
            raise ValueError("transfer_sync: notify is not supported through laxflow; call the inner engine")
        return self.submit(_op(opcode), target_hostname, [buffer], [peer_buffer_address], [length],
                           transport_hint, **tags).result()

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint="", **tags) -> int:
        return self.submit(_READ, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint, **tags).result()

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint="", **tags) -> int:
        return self.submit(_WRITE, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint, **tags).result()

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint="", **tags) -> int:
        return self._handle(self.submit(_READ, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint, **tags))

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint="", **tags) -> int:
        return self._handle(self.submit(_WRITE, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint, **tags))

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint="", **tags) -> int:
        return self._handle(self.submit(_op(opcode), target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint, **tags))

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint="", **tags) -> int:
        return self._handle(self.submit(_WRITE, target_hostname, [buffer], [peer_buffer_address], [length], transport_hint, **tags))

    def transfer_check_status(self, handle: int) -> int:
        """1 done, 0 waiting or running, negative failed (Mooncake's convention); frees a finished handle."""
        future = self._handles.get(handle)
        if future is None:
            return self._engine.transfer_check_status(handle)
        if not future.done():
            return 0
        del self._handles[handle]
        if future.exception() is not None:
            return -1
        return 1 if future.result() == 0 else future.result()

    def get_batch_transfer_status(self, handles: list[int]) -> int:
        """Wait for every handle; 0 when all succeeded, else the first error (as Mooncake's)."""
        worst = 0
        for handle in handles:
            future = self._handles.pop(handle, None)
            if future is None:
                raise ValueError(f"get_batch_transfer_status: unknown handle {handle}")
            try:
                result = future.result()
            except Exception:
                result = -1
            if result != 0 and worst == 0:
                worst = result
        return worst

    def _handle(self, future: Future) -> int:
        handle = next(self._handle_ids)
        self._handles[handle] = future
        return handle

    # ---------------------------------------------------------- execution

    def _execute(self, op, target, buffers, peers, lengths, hint, permit, request, stage, layer, nbytes) -> int:
        """Worker thread: mark, run Mooncake's asynchronous batch, poll it to the end."""
        started = time.monotonic()
        dscp = self.config.wire_dscp(self._protocol, permit.dscp if permit else None)
        token = next(self._tokens)
        peer = self._mark_start(target, token, permit, dscp, request, stage, layer, nbytes)
        status, drained, moved = -1, True, 0.0
        try:
            status = self._transfer(op, target, buffers, peers, lengths, hint, permit, peer, dscp,
                                    request, stage, layer, nbytes)
            moved = time.monotonic()
            if status == 0 and op == _WRITE and peer is not None:
                drained = self._drain(peer, self.config.drain_timeout_s)
                if not drained:
                    self.stats["drain_timeouts"] += 1
            return status
        finally:
            self._mark_end(target, peer, token)
            done = time.monotonic()
            self.records.append(TransferRecord(
                op, target, request, stage, layer, nbytes, permit.msg_id if permit else 0,
                permit.level if permit else -1, dscp if permit else -1, started, moved or done, done,
                status, drained))

    def _transfer(self, op, target, buffers, peers, lengths, hint, permit, peer, dscp, request, stage, layer,
                  nbytes) -> int:
        """The Mooncake part of :meth:`_execute`: 0 or Mooncake's error."""
        opcode = self._engine.TransferOpcode.Read if op == _READ else self._engine.TransferOpcode.Write
        if peer is not None and dscp >= 0 and peer.data_port is None and lengths[0] > PRIME_BYTES:
            # First contact: Mooncake connects during the first transfer.
            # Send its first bytes alone, learn and mark the connection,
            # then the rest, so all but PRIME_BYTES carry the class.
            status = self._run_batch(target, buffers[:1], peers[:1], [PRIME_BYTES], opcode, hint, None)
            if status != 0:
                return status
            self._refresh_marks(target, peer, rescan=True)
            self._tag_sockets(peer, permit, request, stage, layer, nbytes, dscp)
            buffers = [buffers[0] + PRIME_BYTES, *buffers[1:]]
            peers = [peers[0] + PRIME_BYTES, *peers[1:]]
            lengths = [lengths[0] - PRIME_BYTES, *lengths[1:]]
        mark = None if peer is None or dscp < 0 else (peer, permit, request, stage, layer, nbytes, dscp)
        return self._run_batch(target, buffers, peers, lengths, opcode, hint, mark)

    def _run_batch(self, target, buffers, peers, lengths, opcode, hint, mark) -> int:
        """One Mooncake batch, polled to its end: 0, or Mooncake's error.

        ``mark``: (peer, permit, request, stage, layer, nbytes, dscp) when the
        peer's connections are known and marked.  Mooncake opens another
        connection to the peer when the ones it has are busy (a concurrent
        transfer); 0.3.13 connects it on its I/O thread just after the submit,
        so no per-thread tag reaches it.  The process's sockets are watched
        for ``NEW_CONN_WATCH_S`` after a submit that overlaps another transfer
        to the peer, and a new connection is marked when it appears: its
        first packets can leave unmarked (measured on the testbed: 0 or 42 KB).
        """
        before = socket_inodes() if mark is not None else None
        batch = self._engine.batch_transfer_async(target, buffers, peers, lengths, opcode, hint)
        if batch is None or batch <= 0:
            return -1 if batch is None or batch == 0 else batch
        watch_until = 0.0
        if mark is not None:
            with self._peers_lock:
                overlapping = len(mark[0].inflight) > 1
            if not self._mark_new(target, mark, before) and overlapping:
                watch_until = time.monotonic() + NEW_CONN_WATCH_S
        sleep = 5e-5
        while (status := self._engine.transfer_check_status(batch)) == 0:
            if watch_until:
                if self._mark_new(target, mark, before) or time.monotonic() > watch_until:
                    watch_until = 0.0
                time.sleep(1e-4)
                continue
            time.sleep(sleep)
            sleep = min(sleep * 2, 1e-3)
        return 0 if status == 1 else status

    def _mark_new(self, target: str, mark: tuple, before: dict[int, int]) -> bool:
        """Mark and tag the peer's connections opened since ``before``; True if there were any."""
        new = set(socket_inodes()) - set(before)
        if not new:
            return False
        peer, permit, request, stage, layer, nbytes, dscp = mark
        known = self._refresh_marks(target, peer, rescan=True)
        self._tag_sockets(peer, permit, request, stage, layer, nbytes, dscp, only=new)
        return any(s.inode in new for s in known)  # another thread's socket (hooks, ZeroMQ) is not the one

    def _drain(self, peer: _PeerSockets, timeout: float) -> bool:
        """Wait until the bytes written so far to the peer's connections are acknowledged; False on timeout.

        Per connection the goal is the acknowledged count plus what is queued
        now, so another transfer that keeps writing to one of them (Mooncake
        gives concurrent transfers their own connections, but the wrapper
        cannot tell which is whose) delays this one by at most what it had
        queued, not until it ends.
        """
        with self._peers_lock:
            known = list(peer.sockets)
        goals = []
        for s in known:
            now = _tcp_progress(s)
            if now is not None and now[1] > 0:
                goals.append((s, now[0] + now[1]))
        end = time.monotonic() + timeout
        while goals:
            goals = [(s, goal) for s, goal in goals if (_tcp_progress(s) or (goal, 0))[0] < goal]
            if not goals:
                break
            if time.monotonic() >= end:
                return False
            time.sleep(2e-4)
        return True

    def _mark_start(self, target, token, permit, dscp, request, stage, layer, nbytes) -> _PeerSockets | None:
        if permit is None or dscp < 0 and self._protocol != "rdma":
            return None
        if self._protocol == "rdma":
            if self.config.qp_lookup is not None:
                for qp in self.config.qp_lookup(target):
                    self._gate.write_tag(TagKind.QP, qp, TagValue(permit.msg_id, request, nbytes, stage, layer, dscp))
            return None
        if not self.config.tag_sockets:
            return None
        with self._peers_lock:
            peer = self._peers.get(target)
            if peer is None:
                peer = self._peers[target] = _PeerSockets(set(socket_inodes()))
            peer.inflight[token] = permit.level << 8 | dscp
            if peer.data_port is None:  # nothing to mark before Mooncake connects
                peer.first_contact.add(token)
                return peer
        self._refresh_marks(target, peer)
        self._tag_sockets(peer, permit, request, stage, layer, nbytes, dscp)
        return peer

    def _tag_sockets(self, peer: _PeerSockets, permit: Permit, request, stage, layer, nbytes, dscp,
                     only: set[int] | None = None) -> None:
        """Socket flow tags for the shim: this message now rides the peer's connections.

        The tag carries no byte count: with one, the shim reports the message
        complete once its bytes are written into the socket, before the peer
        has them, and the daemon would let a lower level start under its tail.
        Its COMPLETION is the wrapper's (after the drain); the shim's, when
        the tag moves on, is a duplicate the daemon ignores -- unless the
        message it ends still runs: so a connection's tag moves only while no
        other transfer to the peer is in flight (then IP_TOS alone carries
        the class); ``only``: the inodes of connections this transfer just
        opened, tagged in any case.
        """
        with self._peers_lock:
            known = list(peer.sockets)
            alone = len(peer.inflight) <= 1
        for sock in known:
            if (sock.inode not in only) if only is not None else not alone:
                continue
            self._gate.write_tag(TagKind.SOCKET, sock.fd, TagValue(permit.msg_id, request, 0, stage, layer, dscp))

    def _mark_end(self, target: str, peer: _PeerSockets | None, token: int) -> None:
        if peer is None:
            return
        with self._peers_lock:
            peer.inflight.pop(token, None)
            still = bool(peer.inflight)
            # Learned while the first transfer ran, the set may lack the
            # peer's accepted end (connected before accept() gave it an fd).
            stale = token in peer.first_contact or not peer.sockets
            peer.first_contact.discard(token)
        if still:
            self._refresh_marks(target, peer)
        if stale:
            found = self._discover(target, peer)
            with self._peers_lock:
                peer.sockets, peer.scanned_at = found, time.monotonic()

    def _refresh_marks(self, target: str, peer: _PeerSockets, rescan: bool = False) -> list[TcpSocket]:
        """Mark the peer's connections with the most urgent class in flight; rescan if needed."""
        with self._peers_lock:
            if not peer.inflight:
                return peer.sockets
            top = min(peer.inflight.values())
            dscp = top & 0xFF
            # Only a connection no other transfer is using can drain: with one running, waiting would hold
            # the urgent transfer behind it for the whole bound, so the class rises at once there.
            raising = (peer.marked is not None and top >> 8 < peer.marked >> 8 and dscp != peer.marked & 0xFF
                       and len(peer.inflight) == 1)
            peer.marked = top
            known = list(peer.sockets)
        if raising and self.config.raise_wait_s > 0:
            self.stats["raise_waits"] += 1
            if not self._drain(peer, self.config.raise_wait_s):
                self.stats["raise_wait_timeouts"] += 1
        due = rescan or time.monotonic() - peer.scanned_at > RESCAN_S  # Mooncake may have opened more
        if due or not known or not all(set_dscp(s.fd, s.inode, dscp) for s in known):
            known = self._discover(target, peer)
            for s in known:
                set_dscp(s.fd, s.inode, dscp)
            with self._peers_lock:
                peer.sockets, peer.scanned_at = known, time.monotonic()
        return known

    def _discover(self, target: str, peer: _PeerSockets) -> list[TcpSocket]:
        """Mooncake's connections to target: to or from its TcpTransport port.

        That port is learned at first contact: the connection that appeared
        since ``peer.before`` towards the target's host (its accepted end, when
        the peer lives in this process, is on one of our listening ports).
        """
        host, _, port = target.rpartition(":")
        try:
            rpc_port = int(port)
            ip = socket.gethostbyname(host)
        except (ValueError, OSError):
            return []
        socks = tcp_sockets()
        if peer.data_port is None:
            listening = {s.local[1] for s in socks if s.state == "LISTEN"}
            towards = [s for s in socks if s.state == "ESTABLISHED" and s.inode not in self._baseline
                       and s.remote[0] == ip and rpc_port not in (s.remote[1], s.local[1])]
            # an engine handed over after it had talked to the peer: its old connections
            new = [s for s in towards if s.inode not in peer.before] or towards
            accepted = [s for s in new if s.local[1] in listening]
            if not new:
                return []
            with self._peers_lock:
                peer.data_port = accepted[0].local[1] if accepted else new[0].remote[1]
        data = (ip, peer.data_port)
        return [s for s in socks if s.state == "ESTABLISHED" and data in (s.remote, s.local)]


_TCPI_BYTES_ACKED = 120  # offset of tcpi_bytes_acked in Linux's struct tcp_info (>= 4.1), counts the SYN


def _tcp_progress(sock: TcpSocket) -> tuple[int, int] | None:
    """(bytes acknowledged, bytes written but not acknowledged) of one of Mooncake's sockets; None if gone."""
    try:
        dup = os.dup(sock.fd)
    except OSError:
        return None
    try:
        same = os.fstat(dup).st_ino == sock.inode  # else closed, and the number reused meanwhile
    except OSError:
        same = False
    if not same:
        os.close(dup)
        return None
    try:
        with socket.socket(fileno=dup) as s:  # closes the duplicate only
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_BYTES_ACKED + 8)
            if len(info) < _TCPI_BYTES_ACKED + 8:
                return None
            return struct.unpack_from("Q", info, _TCPI_BYTES_ACKED)[0], unacked_bytes(s.fileno())
    except OSError:
        return None


def _op(opcode: Any) -> str:
    name = getattr(opcode, "name", str(opcode)).lower()
    if name.endswith("read"):
        return _READ
    if name.endswith("write"):
        return _WRITE
    raise ValueError(f"opcode: expected TransferOpcode.Read or .Write, got {opcode!r}")
