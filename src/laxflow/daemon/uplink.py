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

log = logging.getLogger("laxflow.daemon.uplink")
UNKNOWN_PEER = "*"  # Transfer.dst when this node does not know the receiving port (ignored by Algorithm 1)


class Uplink:
    def __init__(self, address: str, node: str, core: DaemonCore, keys: ClientKeys | None, heartbeat_s: float,
                 wall_offset: Callable[[], float]) -> None:
        self.node = node
        self.core = core
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = 4 * heartbeat_s
        self.wall_offset = wall_offset
        self.link = CoordinatorLink(address, sender=node, keys=keys)
        self.address = address
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
                if info is not None:
                    self._batches[r.batch] = info
                    self.link.send(m.BatchArrival(self.node, info))
            elif self._batches.pop(r.batch, None) is not None:
                self.link.send(m.BatchDeparture(self.node, r.batch))

    @property
    def next_due(self) -> float:
        """When :meth:`tick` next has a heartbeat to send (the loop sleeps no longer)."""
        return self._next_beat

    def tick(self, now: float) -> None:
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
