"""The coordinator process: ZeroMQ sockets and Prometheus around the core.

``laxflow coordinator`` builds one :class:`CoordinatorServer` and calls
:meth:`serve` on the main thread; everything below runs on that thread
(ZeroMQ's CURVE authenticator and the metrics HTTP server run on their own
threads). Per poll cycle: drain up to ``_BURST`` frames from the ROUTER into
:class:`~laxflow.coordinator.core.CoordinatorCore`, answer replies, then run
Algorithm 1 once if anything changed and publish the decision on PUB; every
heartbeat period, :meth:`CoordinatorCore.tick` (liveness, republish).

No frame stops the loop: every refused frame is counted by reason
(``laxflow_coordinator_frames_dropped_total``) and logged at a bounded rate;
an exception inside the core is logged, counted and the frame dropped.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import signal
import threading
import time
from dataclasses import dataclass

import msgpack
import numpy as np
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from laxflow.coordinator.client import Endpoints
from laxflow.coordinator.core import CoordinatorConfig, CoordinatorCore, Publish, Reply
from laxflow.coordinator.keys import ServerKeys
from laxflow.metrics_http import DEFAULT_BIND, check_bind, serve_registry
from laxflow.errors import UserError
from laxflow.protocol import messages as m
from laxflow.protocol.wire import (MAX_FRAME_BYTES, PROTOCOL_VERSION, SOCKET_MAX_BYTES, DropCounter, DropReason,
                                   DuplicateFilter, ProtocolError, decode, encode, new_msg_id)

log = logging.getLogger("laxflow.coordinator")

_BURST = 2000  # frames drained before deciding: bounds decision latency under a flood
_ACCEPTED = (m.Hello, m.Heartbeat, m.BatchArrival, m.BatchDeparture, m.StatusRequest)
SENDER = "coordinator"


def decision_frame(decision: m.Decision, sender: str = SENDER) -> bytes:
    """The Decision's frame, byte for byte what ``encode(decision, sender, check=False)`` packs.

    Written out for this one message: with 1,000s of batches the generic
    encoder's per-field closures cost several times more (the body is built
    from validated reports, and every receiver validates it). Called on the
    coordinator's loop thread.
    """
    d = decision
    body = {"coordinator_id": d.coordinator_id, "seq": d.seq, "now": d.now, "trigger": d.trigger,
            "order": [{"batch_id": r.batch_id, "rank": r.rank, "red": r.red, "finish": r.finish, "nodes": list(r.nodes)}
                      for r in d.order],
            "pruned": list(d.pruned)}
    frame = msgpack.packb({"v": PROTOCOL_VERSION, "msg_id": new_msg_id(), "type": m.Decision.TYPE, "sender": sender,
                           "ts": time.time(), "body": body}, use_bin_type=True)
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(DropReason.OVERSIZED, f"decision is {len(frame)} bytes (max {MAX_FRAME_BYTES})")
    return frame
_HANDSHAKE_FAILURES = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other",
}


@dataclass(frozen=True)
class ServerConfig:
    """``laxflow coordinator`` flags, validated once (see :meth:`check`)."""

    bind: str
    curve_keys: str | None = None
    insecure: bool = False
    metrics_port: int | None = None
    core: CoordinatorConfig = CoordinatorConfig()
    require_keys: bool = False  # refuse to start without CURVE, loopback included
    metrics_bind: str | None = None  # /metrics listens here; None: the --bind host if an IP address, else loopback

    def check(self) -> Endpoints:
        ep = Endpoints.parse(self.bind)
        if self.curve_keys and self.insecure:
            raise UserError("coordinator: --curve-keys and --insecure exclude each other")
        if self.require_keys and not self.curve_keys:
            raise UserError(
                f"coordinator: --require-keys: refusing to bind {self.bind} without CURVE: pass --curve-keys DIR "
                "(create it with `laxflow keys generate DIR`)"
            )
        if not ep.loopback and not self.curve_keys and not self.insecure:
            raise UserError(
                f"coordinator: refusing to bind {self.bind} without CURVE: pass --curve-keys DIR "
                "(create it with `laxflow keys generate DIR`), or --insecure on a trusted network"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise UserError(f"coordinator: --metrics-port must be 0..65535, got {self.metrics_port}")
        if self.metrics_bind is not None:
            check_bind(self.metrics_bind, "coordinator: --metrics-bind")
        return ep

    @property
    def metrics_address(self) -> str:
        """Where /metrics listens: --metrics-bind, else the control address (--bind) when it is one IP
        address, else loopback (a wildcard or ipc bind does not expose the metrics)."""
        if self.metrics_bind is not None:
            return self.metrics_bind
        host = Endpoints.parse(self.bind).host
        try:
            return host if not ipaddress.ip_address(host).is_unspecified else DEFAULT_BIND
        except ValueError:  # ipc, "*", a host or interface name
            return DEFAULT_BIND

    @property
    def auth(self) -> str:
        """How peers are admitted (one of ``messages.AUTH_MODES``), for status."""
        if self.curve_keys:
            return "curve"
        return "none-loopback" if Endpoints.parse(self.bind).loopback else "none-insecure"


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter("laxflow_coordinator_decisions", "Runs of Algorithm 1 published", registry=r)
        self.latency = Histogram(
            "laxflow_coordinator_decision_seconds",
            "First report of a burst received -> decision published",
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.batches = Gauge("laxflow_coordinator_active_batches", "Active batches", registry=r)
        self.requests = Gauge("laxflow_coordinator_active_requests", "Active requests", registry=r)
        self.pruned = Gauge("laxflow_coordinator_pruned_requests", "Active requests in the scavenger class", registry=r)
        self.pruned_total = Counter("laxflow_coordinator_pruned", "Requests pruned by Algorithm 1", registry=r)
        self.daemons = Gauge("laxflow_coordinator_daemons_alive", "Daemons heard from within dead-after", registry=r)
        self.frames = Counter("laxflow_coordinator_frames", "Frames received, by message type", ["type"], registry=r)
        self.dropped = Counter(
            "laxflow_coordinator_frames_dropped", "Frames refused, by reason", ["reason"], registry=r
        )
        for reason in DropReason:
            self.dropped.labels(reason.value)
        self.resyncs = Counter("laxflow_coordinator_resync_requests", "ResyncRequests sent to daemons", registry=r)
        self.errors = Counter("laxflow_coordinator_internal_errors", "Frames whose handling raised", registry=r)
        self.handshakes = Counter(
            "laxflow_coordinator_handshake_failures",
            "Peers refused at the ZeroMQ handshake (auth: unknown CURVE key; protocol: no or wrong security)",
            ["kind"], registry=r,
        )
        for kind in _HANDSHAKE_FAILURES.values():
            self.handshakes.labels(kind)
        self.conflicts = Gauge(
            "laxflow_coordinator_report_conflicts", "Batch reports refused: a request already in another batch", registry=r
        )


class CoordinatorServer:
    """Binds the sockets on construction; :meth:`serve` runs the loop."""

    def __init__(self, config: ServerConfig, registry: CollectorRegistry | None = None) -> None:
        self.endpoints = config.check()
        keys = ServerKeys.load(config.curve_keys) if config.curve_keys else None
        self.config = config
        self.ctx = zmq.Context()
        self.auth = None
        if keys is not None:
            from zmq.auth.thread import ThreadAuthenticator

            self.auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("laxflow.coordinator.auth"))
            self.auth.start()
            self.auth.configure_curve(domain="*", location=str(keys.clients_dir))
        self.router = self._socket(zmq.ROUTER, keys)
        self.pub = self._socket(zmq.PUB, keys)
        try:
            self.router.bind(self.endpoints.router)
            self.pub.bind(self.endpoints.pub)
        except zmq.ZMQError as exc:
            self.close()
            raise UserError(f"coordinator: cannot bind {config.bind} (PUB {self.endpoints.pub}): {exc}") from None
        self.core = CoordinatorCore(config.core, time.time())
        self.registry = registry or CollectorRegistry()
        self.metrics = _Metrics(self.registry)
        if config.metrics_port is not None:
            try:
                serve_registry(self.registry, config.metrics_address, config.metrics_port, "coordinator")
            except UserError:
                self.close()
                raise
        self.drops = DropCounter()
        self._dups = DuplicateFilter()
        self._latencies: collections.deque[float] = collections.deque(maxlen=1000)
        self._log_budget = dict.fromkeys(DropReason, 20)
        self.stop = threading.Event()
        self.decision_count = 0
        self.handshake_failures = 0
        self.handshakes_by_kind = dict.fromkeys(_HANDSHAKE_FAILURES.values(), 0)
        self._closed = False

    def _socket(self, kind: int, keys: ServerKeys | None) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        sock.maxmsgsize = SOCKET_MAX_BYTES
        sock.sndhwm = sock.rcvhwm = 10000
        if keys is not None:
            sock.curve_server = True
            sock.curve_secretkey = keys.secret
            sock.curve_publickey = keys.public
        return sock

    # ------------------------------------------------------------ loop

    def serve(self, install_signals: bool = False) -> None:
        """Run until :attr:`stop` is set (or SIGTERM/SIGINT when ``install_signals``)."""
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop.set())
        log.info("coordinator %s: ROUTER %s, PUB %s", self.core.id, self.endpoints.router, self.endpoints.pub)
        period = self.config.core.heartbeat_s
        next_tick = time.monotonic() + period
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        # Handshake failures never reach the ROUTER as frames: the socket monitor is how they are counted.
        events = 0
        for e in _HANDSHAKE_FAILURES:
            events |= e
        monitors = [s.get_monitor_socket(events) for s in (self.router, self.pub)]
        for mon in monitors:
            poller.register(mon, zmq.POLLIN)
        try:
            while not self.stop.is_set():
                wait = max(0.0, min(next_tick - time.monotonic(), 0.2))
                ready = dict(poller.poll(int(wait * 1000) + 1))
                for mon in monitors:
                    if mon in ready:
                        self._handshake_events(mon)
                if self.router in ready:
                    self.drain()
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + period
                    self._send(self.core.tick(time.time()))
                    self._decide(time.perf_counter())
                    self._gauges()
        finally:
            for sock, mon in zip((self.router, self.pub), monitors):
                sock.disable_monitor()
                mon.close(linger=0)
            self.close()

    def _handshake_events(self, mon: zmq.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = _HANDSHAKE_FAILURES.get(event["event"])
            if kind is not None:
                self.handshake_failures += 1
                self.handshakes_by_kind[kind] += 1
                self.metrics.handshakes.labels(kind).inc()
                if self.handshake_failures <= 20 or self.handshake_failures % 1000 == 0:
                    log.warning("coordinator: refused a peer at the handshake (%s, %s); %d so far",
                                kind, event.get("endpoint", b"").decode(errors="replace"), self.handshake_failures)

    def drain(self) -> None:
        """Handle every frame waiting (up to _BURST), then decide once."""
        first: float | None = None
        for _ in range(_BURST):
            try:
                parts = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            t = time.perf_counter()
            self._frame(parts)
            if first is None and self.core.dirty:
                first = t
        if first is not None:
            self._decide(first)
            self._gauges()

    def _frame(self, parts: list[bytes]) -> None:
        if len(parts) != 2:
            # ROUTER always prepends the identity: anything but [identity, frame] is malformed
            return self._drop(DropReason.MALFORMED, f"{len(parts) - 1} frames")
        identity, frame = parts
        try:
            env = decode(frame)
        except ProtocolError as exc:
            return self._drop(exc.reason, exc.detail)
        if self._dups.seen(env):
            return self._drop(DropReason.DUPLICATE, f"msg_id {env.msg_id} from {env.sender}")
        if not isinstance(env.body, _ACCEPTED):
            return self._drop(DropReason.UNEXPECTED, f"{env.type} from {env.sender}")
        self.metrics.frames.labels(env.type).inc()
        try:
            if isinstance(env.body, m.StatusRequest):
                self._reply_status(identity, env.body)
            else:
                self._send(self.core.handle(env, identity, time.time()))
        except Exception:  # a bug must not take the cluster's coordinator down
            self.metrics.errors.inc()
            log.exception("coordinator: handling %s from %s failed; frame dropped", env.type, env.sender)

    def _drop(self, reason: DropReason, detail: str) -> None:
        self.drops.add(reason)
        self.metrics.dropped.labels(reason.value).inc()
        budget = self._log_budget[reason]
        if budget > 0 or self.drops.counts[reason.value] % 1000 == 0:
            self._log_budget[reason] = budget - 1
            log.warning("coordinator: dropped frame (%s: %s); %d so far", reason.value, detail[:200], self.drops.counts[reason.value])

    def _send(self, outs: list[Reply | Publish]) -> None:
        for out in outs:
            if isinstance(out, Reply):
                if isinstance(out.msg, m.ResyncRequest):
                    self.metrics.resyncs.inc()
                try:
                    self.router.send_multipart([out.identity, encode(out.msg, SENDER)], zmq.NOBLOCK)
                except zmq.Again:  # that daemon's queue is full: it will resync on its next heartbeat
                    log.warning("coordinator: reply %s to a slow peer dropped", type(out.msg).__name__)
            else:
                self.pub.send(decision_frame(out.msg), zmq.NOBLOCK)  # a Decision again

    def _decide(self, first: float) -> None:
        before = len(self.core.pruned)
        decision = self.core.decide(time.time())
        if decision is None:
            return
        self.pub.send(decision_frame(decision), zmq.NOBLOCK)  # built from validated reports
        elapsed = time.perf_counter() - first
        self._latencies.append(elapsed)
        self.metrics.decisions.inc()
        self.decision_count += 1
        self.metrics.latency.observe(elapsed)
        self.metrics.pruned_total.inc(max(len(self.core.pruned) - before, 0))

    def _gauges(self) -> None:
        now = time.time()
        core = self.core
        self.metrics.batches.set(len(core.batches))
        self.metrics.requests.set(len(core.owner))
        self.metrics.pruned.set(len(core.pruned))
        self.metrics.conflicts.set(core.conflicts)
        self.metrics.daemons.set(sum(1 for d in core.daemons.values() if now - d.last_seen <= core.config.dead_after_s))

    def latency_summary(self) -> m.LatencySummary:
        if not self._latencies:
            return m.LatencySummary(0, 0.0, 0.0, 0.0, 0.0)
        ms = np.array(self._latencies) * 1e3
        return m.LatencySummary(
            count=self.decision_count,
            last=float(ms[-1]),
            p50=float(np.percentile(ms, 50)),
            p99=float(np.percentile(ms, 99)),
            max=float(ms.max()),
        )

    def _reply_status(self, identity: bytes, req: m.StatusRequest) -> None:
        def status(detail: bool) -> m.StatusResponse:
            return self.core.status(time.time(), detail, self.latency_summary(), dict(self.drops.counts),
                                    self.config.auth, self.handshakes_by_kind)

        try:
            frame = encode(status(req.detail), SENDER)
        except ProtocolError:  # too many batches to list: send the summary
            frame = encode(status(False), SENDER)
        try:
            self.router.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("coordinator: status reply to a slow peer dropped")

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        for s in (getattr(self, "router", None), getattr(self, "pub", None)):
            if s is not None:
                s.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
