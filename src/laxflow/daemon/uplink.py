"""The daemon's side of the coordinator protocol.

Owned by :class:`~laxflow.daemon.service.Daemon`, called on its loop thread:
:meth:`Uplink.report` with the core's batch reports (arrival and departure
only), :meth:`Uplink.tick` every loop iteration (heartbeat, receive, apply).
What comes back -- the coordinator's RED order and pruned set -- goes into the
core with :meth:`DaemonCore.apply_order`. With the coordinator silent for
``dead_after_s`` the daemon says it runs locally (metrics, status,
heartbeats) and keeps scheduling with what it has; ZeroMQ reconnects by
itself and the coordinator asks for a full-state Hello when it sees a daemon
it does not know.

A handshake the coordinator refuses (a CURVE key it does not admit, keys on
one side only, a wrong coordinator public key) would leave the daemon in
local mode with nothing said: the link's socket monitors report it, the
uplink logs one warning line per change of reason, counts every refusal
(:attr:`Uplink.auth_failures`, the ``laxflow_daemon_coordinator_auth_failures``
metric), keeps the reason for the daemon's status (:attr:`Uplink.refused`)
and starts the refused socket over with a backoff, since ZeroMQ does not
retry after a refusal: a daemon whose key is admitted later comes back by
itself.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from laxflow.coordinator.client import CoordinatorLink
from laxflow.coordinator.keys import ClientKeys
from laxflow.daemon.core import DaemonCore
from laxflow.daemon.state import BatchReport
from laxflow.protocol import messages as m
from laxflow.protocol.wire import ProtocolError

log = logging.getLogger("laxflow.daemon.uplink")
UNKNOWN_PEER = "*"  # Transfer.dst when this node does not know the receiving port (ignored by Algorithm 1)
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 10.0  # reconnecting after a refused handshake: first wait, longest wait

_RANK = {"other": 0, "protocol": 1, "auth": 2}
# Why a handshake failed, with keys and without: (short reason for status, what to do, for the log line).
_REFUSED = {
    ("auth", True): ("coordinator refused our CURVE key",
                     "the coordinator's keys directory does not admit this node's clients/NODE.key"),
    ("auth", False): ("coordinator refused us at the handshake", "check the coordinator's authentication"),
    ("protocol", True): ("coordinator does not use CURVE, we do",
                         "start the coordinator with --curve-keys, or drop keys_dir from this daemon's config"),
    ("protocol", False): ("coordinator requires CURVE keys, we have none",
                          "set keys_dir in this daemon's config (laxflow keys generate DIR --client NODE)"),
    ("other", True): ("CURVE handshake failed", "is coordinator.key in keys_dir the coordinator's public key?"),
    ("other", False): ("handshake failed", "is the address a laxflow coordinator?"),
}


class Uplink:
    def __init__(self, address: str, node: str, core: DaemonCore, keys: ClientKeys | None, heartbeat_s: float,
                 wall_offset: Callable[[], float]) -> None:
        self.node = node
        self.core = core
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = 4 * heartbeat_s
        self.wall_offset = wall_offset
        self.link = CoordinatorLink(address, sender=node, keys=keys, monitor=True)
        self.address = address
        self.has_keys = keys is not None
        self.refused: str | None = None  # why the coordinator will not talk to us, None when it does
        self._refused_rank = -1
        self.auth_failures = {"auth": 0, "protocol": 0, "other": 0}  # handshakes refused, by kind
        self._retry: dict[object, float] = {}  # refused socket -> when to start it over
        self._backoff = RETRY_FIRST_S
        self.unsendable = 0  # reports our own validator refused (never sent)
        self.coordinator_id = ""
        self.applied_seq = -1
        self.last_heard: float | None = None  # monotonic s
        self._seq = 0
        self._next_beat = 0.0
        self._batches: dict[str, m.BatchInfo] = {}  # reported, not yet departed
        self.decisions = 0

    def connected(self, now: float) -> bool:
        return self.last_heard is not None and now - self.last_heard < self.dead_after_s

    def close(self) -> None:
        self.link.close()

    def hello(self, reason: str) -> None:
        ports = tuple(m.PortInfo(f"{self.node}/{p.name}", p.rate) for p in self.core.ports)
        self.link.send(m.Hello(self.node, reason, ports, tuple(self._batches.values())))

    def report(self, reports: list[BatchReport]) -> None:
        for r in reports:
            if r.kind == "arrival":
                info = self._batch_info(r)
                if info is not None and self._send(m.BatchArrival(self.node, info)):
                    self._batches[r.batch] = info
            elif self._batches.pop(r.batch, None) is not None:
                self._send(m.BatchDeparture(self.node, r.batch))

    def _send(self, msg) -> bool:
        """Send one report; a report past the protocol's bounds (e.g. a shim's byte count past 2^50) is
        logged and counted, never sent: it would be refused anyway, and must not stop the loop."""
        try:
            self.link.send(msg)
            return True
        except ProtocolError as exc:
            self.unsendable += 1
            log.warning("report %s to coordinator %s not sent: %s", type(msg).__name__, self.address, exc.detail[:300])
            return False

    @property
    def next_due(self) -> float:
        """When :meth:`tick` next has a heartbeat to send or a refused socket to start over (the loop
        sleeps no longer)."""
        return min(self._next_beat, *self._retry.values()) if self._retry else self._next_beat

    def tick(self, now: float) -> None:
        self._handshakes(now)
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            self._seq += 1
            depths = self.core.queue_depths()
            queues = tuple(m.QueueDepth(f"{self.node}/{port}", level, n, 0) for (port, level), n in sorted(depths.items()))
            mode = "coordinated" if self.connected(now) else "local"
            self.link.send(m.Heartbeat(self.node, self._seq, len(self._batches), mode, self.coordinator_id,
                                       self.applied_seq, queues))
        for env in self.link.receive(0):
            self.last_heard = now
            body = env.body
            if isinstance(body, m.ResyncRequest):
                self.hello("resync")
            elif isinstance(body, m.Decision):
                self._apply(body)

    def _handshakes(self, now: float) -> None:
        """Count refused handshakes, say why once per change of reason, start refused sockets over."""
        for kind, sock in self.link.handshake_events():
            if kind == "ok":
                if self.refused is not None:
                    log.info("coordinator %s: handshake succeeded; coordinated again", self.address)
                self.refused, self._refused_rank, self._backoff = None, -1, RETRY_FIRST_S
                continue
            self.auth_failures[kind] += 1
            reason, hint = _REFUSED[kind, self.has_keys]
            # One line per streak of failures; a more telling reason (auth > protocol > other: the two
            # sockets may fail differently) replaces a vaguer one, never the reverse.
            if self.refused is None or _RANK[kind] > self._refused_rank:
                self.refused, self._refused_rank = reason, _RANK[kind]
                log.warning("%s (coordinator %s, handshake failed: %s): scheduling locally, retrying; %s",
                            reason, self.address, kind, hint.replace("NODE", self.node))
            if kind != "other" and sock not in self._retry:  # ZeroMQ retries "other" by itself, never these
                self._retry[sock] = now + self._backoff
                self._backoff = min(self._backoff * 2, RETRY_MAX_S)
        for sock, at in list(self._retry.items()):
            if now >= at:
                del self._retry[sock]
                self.link.reconnect(sock)

    def _apply(self, d: m.Decision) -> None:
        if d.coordinator_id == self.coordinator_id and d.seq <= self.applied_seq:
            return  # a republished or stale decision
        self.coordinator_id, self.applied_seq = d.coordinator_id, d.seq
        self.core.apply_order({r.batch_id: r.rank for r in d.order}, d.pruned)
        self.decisions += 1

    def _batch_info(self, r: BatchReport) -> m.BatchInfo | None:
        offset = self.wall_offset()
        requests = []
        for name, deadline in r.deadlines.items():
            if deadline is None:
                continue  # Algorithm 1 orders deadlines; a request without one is scheduled locally only
            info = self.core.requests.get(name)
            traffic = tuple(
                m.Transfer(f"{self.node}/{port}", UNKNOWN_PEER, float(row[name]))
                for port, row in sorted(r.traffic.items()) if row.get(name, 0.0) > 0
            )
            requests.append(m.RequestInfo(name, deadline + offset, info.prompt_tokens if info else 0,
                                          info.reused_tokens if info else 0, traffic))
        if not requests:
            return None
        return m.BatchInfo(r.batch, max(0.0, r.compute), tuple(requests))


def wall_offset() -> float:
    """time.time() - time.monotonic(): converts the daemon's clock to the protocol's wall clock."""
    return time.time() - time.monotonic()
