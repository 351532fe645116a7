"""The daemon's side of the hooks API: a ROUTER (requests) and a PUB (pruning advice) on ipc://.

Owned by :class:`~laxflow.daemon.service.Daemon`; every method runs on the
daemon's loop thread, which polls :attr:`socket`. Each request gets exactly
one reply; a ``WaitPermit`` is answered when the core grants the message or
when its timeout passes (the caller then sends anyway: fail open). A frame
that does not decode is counted by reason and answered with ``Ack(ok=False)``
when the sender can be told; nothing a client sends stops the daemon.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import zmq

from laxflow.daemon.core import DaemonCore
from laxflow.errors import UserError
from laxflow.hooks.api import estimate_ttft, request_key, unranked
from laxflow.stage import Stage
from laxflow.protocol import hooks as hm
from laxflow.protocol.shm import share_with_group
from laxflow.protocol.wire import SOCKET_MAX_BYTES, DropCounter, DropReason, ProtocolError, decode, encode

log = logging.getLogger("laxflow.daemon.hooks")


class HooksServer:
    """Serves one daemon core to the node's prefill schedulers and transports."""

    def __init__(self, ctx: zmq.Context, address: str, core: DaemonCore, sender: str,
                 wall_offset: Callable[[], float], status: Callable[[], hm.Status], gid: int | None = None) -> None:
        self.core = core
        self.sender = sender
        self.wall_offset = wall_offset  # time.time() - time.monotonic()
        self.status = status
        self.drops = DropCounter()
        self.calls = 0
        path = address[len("ipc://"):]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        for p in (path, path + ".pub"):
            if os.path.exists(p):
                os.unlink(p)  # a killed daemon's leftover socket file
        self.address = address
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAX_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(address + ".pub")
        for p in (path, path + ".pub"):
            os.chmod(p, 0o600)  # only the daemon's user talks to it, or (gid: its configured group) that group
            try:
                share_with_group(p, gid)
            except OSError as exc:
                raise UserError(f"{p}: cannot give the hooks socket to group {gid}: {exc.strerror}") from None
        self._waiting: dict[int, list[tuple[bytes, float]]] = {}  # msg_id -> (peer, give-up time)
        self._pruned_seq = 0
        self._pruned: tuple[str, ...] = ()

    def close(self) -> None:
        self.socket.close(0)
        self.pub.close(0)
        path = self.address[len("ipc://"):]
        for p in (path, path + ".pub"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------ loop side

    def drain(self, now: float, budget: int = 256) -> int:
        """Handle up to ``budget`` waiting requests; returns how many."""
        n = 0
        # Nothing waiting is the common case on every loop pass: ask the socket (a flag read) rather than
        # let recv raise zmq.Again, whose exception costs tens of us per pass.
        if not self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return 0
        while n < budget:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            n += 1
            if len(frames) != 2:
                self.drops.add(DropReason.MALFORMED)  # a client's DEALER sends one frame per call
                self.core.stats["bad_events"] += 1
                self._reply(frames[0], hm.Ack(False, f"malformed: {len(frames) - 1} frames, expected 1"))
                continue
            self._handle(frames[0], frames[1], now)
        return n

    @property
    def has_waiting(self) -> bool:
        return bool(self._waiting)

    def answer_permits(self, now: float) -> None:
        """Reply to permit waits that were granted or timed out (after each core step)."""
        for msg_id in list(self._waiting):
            m = self.core.messages.get(msg_id)
            granted = m is not None and m.granted is not None
            keep = []
            for peer, until in self._waiting[msg_id]:
                if granted:
                    self._reply(peer, hm.Permit(msg_id, True, m.level, m.dscp))
                elif m is None or now >= until:
                    self._reply(peer, hm.Permit(msg_id, False, 0, 0))
                else:
                    keep.append((peer, until))
            if keep:
                self._waiting[msg_id] = keep
            else:
                del self._waiting[msg_id]

    def publish_pruned(self) -> None:
        """PUB the pruned set when it changed (the loop calls this after each step)."""
        now = tuple(sorted(self.core.pruned()))
        if now != self._pruned:
            self._pruned = now
            self._pruned_seq += 1
            self.pub.send(encode(hm.Pruned(self._pruned_seq, now), self.sender))

    # ------------------------------------------------------------ requests

    def _handle(self, peer: bytes, frame: bytes, now: float) -> None:
        try:
            env = decode(frame)
        except ProtocolError as exc:
            self.drops.add(exc.reason)
            self.core.stats["bad_events"] += 1
            self._reply(peer, hm.Ack(False, f"{exc.reason.value}: {exc.detail}"[:512]))
            return
        self.calls += 1
        body = env.body
        try:
            reply = self._apply(body, peer, now)
        except (UserError, ValueError) as exc:
            self.core.stats["bad_events"] += 1
            reply = hm.Ack(False, str(exc)[:512])
        except Exception as exc:  # a bug must not take the node's scheduling down: count, log, answer
            self.core.stats["internal_errors"] = self.core.stats.get("internal_errors", 0) + 1
            log.exception("hooks call %s failed", type(body).__name__)
            reply = hm.Ack(False, f"internal error: {type(exc).__name__}")
        if reply is not None:
            self._reply(peer, reply)

    def _apply(self, body, peer: bytes, now: float):
        core = self.core
        key = _key
        self.core.stats["hooks_calls"] = self.core.stats.get("hooks_calls", 0) + 1
        if isinstance(body, hm.RegisterRequest):
            deadline = None if body.deadline is None else body.deadline - self.wall_offset()
            core.register_request(key(body.request), deadline, body.prompt_tokens, body.reused_tokens, body.priority)
        elif isinstance(body, hm.BatchFormed):
            traffic = {p: {key(r): b for r, b in row.items()} for p, row in body.traffic.items()}
            core.batch_formed(body.batch, [key(r) for r in body.requests], now, body.compute_s, traffic)
        elif isinstance(body, hm.Layer):
            if body.phase == "begin":
                core.layer_begin(body.batch, body.layer, now)
            elif body.last:
                core.compute_done(body.batch, now)
        elif isinstance(body, hm.Submit):
            core.submit(body.msg_id, key(body.request), Stage.parse(body.stage), body.layer, body.nbytes, now,
                        port=body.port or None, downstream=body.downstream)
        elif isinstance(body, hm.Progress):
            core.progress(body.msg_id, body.bytes_done, now)
        elif isinstance(body, hm.Complete):
            core.complete(body.msg_id, now)
        elif isinstance(body, hm.RequestDone):
            core.request_done(key(body.request), now)
        elif isinstance(body, hm.Bind):
            core.bind_handle(body.pid, body.handle, body.port)
        elif isinstance(body, hm.WaitPermit):
            self._waiting.setdefault(body.msg_id, []).append((peer, now + max(0.0, body.timeout_s)))
            return None  # answered by answer_permits
        elif isinstance(body, hm.PrunedQuery):
            return hm.Pruned(self._pruned_seq, tuple(sorted(core.pruned())))
        elif isinstance(body, hm.Dispatch):
            rates = {p.name: p.rate for p in core.ports}
            loads = dict(zip(rates, core.meter.loads().tolist()))
            ranked = estimate_ttft(body.instances, rates, loads)
            return hm.Advice(tuple(ranked), unranked(body.instances, ranked))
        elif isinstance(body, hm.StatusQuery):
            return self.status()
        else:
            self.drops.add(DropReason.UNEXPECTED)
            return hm.Ack(False, f"unexpected message type {type(body).__name__}")
        return hm.Ack(True, "")

    def _reply(self, peer: bytes, msg) -> None:
        try:
            frame = encode(msg, self.sender)
        except ProtocolError as exc:  # a reply our own validator refuses is a bug: say so to the caller
            self.core.stats["internal_errors"] = self.core.stats.get("internal_errors", 0) + 1
            log.error("hooks reply %s not encodable: %s", type(msg).__name__, exc.detail)
            frame = encode(hm.Ack(False, f"internal error: reply {type(msg).__name__} not encodable"), self.sender)
        try:
            self.socket.send_multipart([peer, frame], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # peer gone or its queue full: the reply is lost, the daemon goes on
            log.debug("hooks reply to %r lost: %s", peer, exc)


def _key(request: str) -> str:
    return str(request_key(request))

