"""Prometheus metrics of one daemon (prometheus-client, its own registry).

Created by the daemon's service; updated on its loop thread (:meth:`observe_step`
per step, :meth:`refresh` a few times a second); served over HTTP by
prometheus-client's own server thread. ``METRIC_NAMES`` is what
``deploy/grafana-dashboard.json`` may use; a test scrapes a real daemon and
checks every name the dashboard names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from laxflow.metrics_http import serve_registry

if TYPE_CHECKING:
    from laxflow.daemon.core import DaemonCore
    from laxflow.daemon.state import StepResult

# Submit-to-permit latency buckets, seconds: 10 us .. 100 ms.
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 1e-1)
class DaemonMetrics:
    """The daemon's series; ``node`` is a label on every one."""

    def __init__(self, node: str, port_names: list[str], levels: int) -> None:
        self.registry = CollectorRegistry()
        self.node = node
        self.port_names = port_names
        self.levels = levels
        r = self.registry
        self.queue_depth = Gauge("laxflow_daemon_queue_depth", "Messages waiting for a permit, per port and RMLQ level "
                                 "(level = K is the scavenger class)", ["node", "port", "level"], registry=r)
        self.permits = Counter("laxflow_daemon_permits", "Permits granted", ["node", "port"], registry=r)
        self.spare_permits = Counter("laxflow_daemon_spare_permits", "Permits granted into a port's spare capacity "
                                     "with higher ranks unfinished (the permit rule's work-conserving grant)",
                                     ["node", "port"], registry=r)
        self.latency = Histogram("laxflow_daemon_submit_to_permit_seconds", "Message submit to permit written",
                                 ["node"], buckets=LATENCY_BUCKETS, registry=r)
        self.live = Gauge("laxflow_daemon_live_messages", "Messages submitted and not yet complete", ["node"], registry=r)
        self.link_load = Gauge("laxflow_daemon_link_load", "Measured port utilization (EWMA, 0..1)", ["node", "port"],
                               registry=r)
        self.pruned = Gauge("laxflow_daemon_pruned_requests", "Requests currently in the scavenger class", ["node"],
                            registry=r)
        self.events = Counter("laxflow_daemon_events", "Ring and hooks events applied (kind expired: messages forgotten "
                              "message_ttl_s after their submit, never completed)", ["node", "kind"], registry=r)
        self.bad_events = Counter("laxflow_daemon_bad_events", "Events or hooks calls dropped as malformed", ["node"],
                                  registry=r)
        self.internal_errors = Counter("laxflow_daemon_internal_errors", "Events or calls whose handling raised "
                                       "(logged; the daemon goes on)", ["node"], registry=r)
        self.ring_drops = Gauge("laxflow_daemon_ring_drops", "Event pushes the shims' ring refused (full), since the "
                                "segment was created", ["node"], registry=r)
        self.shim_failopen = Gauge("laxflow_daemon_shim_failopen_wrs", "Work requests shims released without a permit",
                                   ["node"], registry=r)
        self.heartbeat_age = Gauge("laxflow_daemon_heartbeat_age_seconds", "Age of the daemon's shared-memory heartbeat",
                                   ["node"], registry=r)
        self.coordinator_connected = Gauge("laxflow_daemon_coordinator_connected", "1 when a coordinator answers, else "
                                           "0 (the daemon schedules locally)", ["node"], registry=r)
        self.coordinator_age = Gauge("laxflow_daemon_coordinator_last_seen_seconds", "Seconds since the last message "
                                     "from the coordinator (-1: never)", ["node"], registry=r)
        self.coordinator_auth_failures = Counter(
            "laxflow_daemon_coordinator_auth_failures", "Handshakes with the coordinator that failed, by kind (auth: "
            "it refused our CURVE key; protocol: CURVE on one side only; other: broken off, e.g. a wrong coordinator "
            "public key); the daemon schedules locally meanwhile", ["node", "kind"], registry=r)
        for kind in ("auth", "protocol", "other"):
            self.coordinator_auth_failures.labels(node, kind)
        self.mode = Gauge("laxflow_daemon_mode", "1 on the daemon's current mode", ["node", "mode"], registry=r)
        self.reports = Counter("laxflow_daemon_batch_reports", "Batch arrival/departure reports", ["node", "kind"],
                               registry=r)
        self.decisions = Counter("laxflow_daemon_decisions", "Policy decisions", ["node"], registry=r)
        self._last_stats: dict[str, int] = {}
        # Children resolved once: labels() per permit costs a lock and a dict walk on the loop's hot path.
        self._permits_by_port = [self.permits.labels(node, p) for p in self.port_names]
        self._spare_by_port = [self.spare_permits.labels(node, p) for p in self.port_names]
        self._latency = self.latency.labels(node)

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint on ``host`` (``--metrics-bind``); returns the bound port (``port`` 0 picks one)."""
        return serve_registry(self.registry, host, port, "daemon")

    def observe_step(self, result: "StepResult") -> None:
        for p in result.permits:
            self._permits_by_port[p.port].inc()
            if p.spare:
                self._spare_by_port[p.port].inc()
            self._latency.observe(max(0.0, p.waited))
        for r in result.reports:
            self.reports.labels(self.node, r.kind).inc()

    def refresh(self, core: "DaemonCore", heartbeat_age: float, ring: dict[str, int], connected: bool,
                coordinator_age: float | None, local: bool) -> None:
        """Gauges from the core's state (a few times a second)."""
        depths = core.queue_depths()
        for port in self.port_names:
            for level in range(self.levels + 1):
                self.queue_depth.labels(self.node, port, str(level)).set(depths.get((port, level), 0))
        for port, load in zip(self.port_names, core.meter.loads().tolist()):
            self.link_load.labels(self.node, port).set(load)
        self.live.labels(self.node).set(len(core.messages))
        self.pruned.labels(self.node).set(len(core.pruned()))
        for key, kind in (("submits", "submit"), ("completions", "completion"), ("layer_boundaries", "layer_boundary"),
                          ("expired_messages", "expired")):
            self._count(self.events.labels(self.node, kind), core.stats, key)
        self._count(self.bad_events.labels(self.node), core.stats, "bad_events")
        self._count(self.decisions.labels(self.node), core.stats, "decisions")
        self._count(self.internal_errors.labels(self.node), core.stats, "internal_errors")
        self.ring_drops.labels(self.node).set(ring.get("events_dropped", 0))
        self.shim_failopen.labels(self.node).set(ring.get("wr_failopen", 0))
        self.heartbeat_age.labels(self.node).set(heartbeat_age)
        self.coordinator_connected.labels(self.node).set(1 if connected else 0)
        self.coordinator_age.labels(self.node).set(-1 if coordinator_age is None else coordinator_age)
        self.mode.labels(self.node, "local").set(1 if local else 0)
        self.mode.labels(self.node, "coordinated").set(0 if local else 1)

    def count_auth_failures(self, counts: dict[str, int]) -> None:
        """The uplink's refused handshakes by kind (cumulative counts; the counter takes the increase)."""
        for kind in counts:
            self._count(self.coordinator_auth_failures.labels(self.node, kind), counts, kind, f"auth_{kind}")

    def _count(self, counter: Counter, stats: dict[str, int], key: str, last: str | None = None) -> None:
        last = last or key
        delta = stats.get(key, 0) - self._last_stats.get(last, 0)
        if delta > 0:
            counter.inc(delta)
        self._last_stats[last] = stats.get(key, 0)
