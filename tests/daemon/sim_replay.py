"""Record what the simulator's MFS decided, and replay the same flow events through the daemon core.

:class:`RecordingPolicy` wraps the very ``MfsPolicy`` the simulator runs (the
simulator is not touched): at every ``decide`` it notes each live flow's
request-level facts, bytes left and the RMLQ level (``Decision.queue``) MFS
gave it, and per link the cumulative bytes that crossed it (the link-load
input). :func:`replay` turns that record into the events a node daemon gets --
message submits, layer boundaries, compute end, progress and completions,
port byte counters -- and asks :class:`~laxflow.daemon.core.DaemonCore` at the
same instants.

A simulated flow group (a collective, a sharded KV transfer) spreads over
several links; a daemon message rides one port. The replay gives each flow
one message on the port the policy itself treats as the flow's bottleneck
(first link with the smallest capacity / weight) with the bytes that cross it
(size x weight): MLU, RLI and the explicit-load average are the same numbers
for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from laxflow.daemon.core import CoreConfig, DaemonCore
from laxflow.daemon.ports import PortSpec
from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.flow import Flow
from laxflow.policy.mfs import MfsPolicy


@dataclass
class FlowFacts:
    id: str
    msg_id: int
    port: int
    weight: float
    size: float
    stage: object
    request: str
    batch: str
    deadline: float | None
    downstream: float
    layer: int | None


@dataclass
class DecideRecord:
    now: float
    flows: list[tuple[str, int | None, bool, float, int]]  # id, current_layer, compute_done, remaining, queue
    link_bytes: np.ndarray  # cumulative bytes per link up to now


@dataclass
class CompleteRecord:
    now: float
    flow: str
    link_bytes: np.ndarray | None  # set when the network went empty with this completion


@dataclass
class Recording:
    capacity: np.ndarray
    link_ids: list[str]
    facts: dict[str, FlowFacts] = field(default_factory=dict)
    events: list[DecideRecord | CompleteRecord] = field(default_factory=list)


class RecordingPolicy(FlowPolicy):
    """Delegates to an ``MfsPolicy`` and records its inputs and levels."""

    name = "mfs"

    def __init__(self, inner: MfsPolicy, link_ids: list[str], capacity: np.ndarray) -> None:
        self.inner = inner
        self.rec = Recording(np.asarray(capacity, float), list(link_ids))
        self._bytes = np.zeros(len(capacity))
        self._last: dict[Flow, float] = {}  # remaining at the last decision

    @property
    def dscp_map(self):
        return self.inner.dscp_map

    def decide(self, snap: Snapshot) -> Decision:
        for f, rem in zip(snap.flows, snap.remaining.tolist()):
            if f.id not in self.rec.facts:
                self.rec.facts[f.id] = self._facts(f, snap)
            prev = self._last.get(f)
            if prev is not None:
                self._bytes[f.links] += (prev - rem) * f.weights
        decision = self.inner.decide(snap)
        self._last = dict(zip(snap.flows, snap.remaining.tolist()))
        rows = [(f.id, f.current_layer, f.compute_done, rem, q)
                for f, rem, q in zip(snap.flows, snap.remaining.tolist(), decision.queue.tolist())]
        self.rec.events.append(DecideRecord(snap.now, rows, self._bytes.copy()))
        return decision

    def on_complete(self, flow: Flow, now: float) -> None:
        prev = self._last.pop(flow, None)
        if prev is not None:
            self._bytes[flow.links] += prev * flow.weights
        self.inner.on_complete(flow, now)
        self.rec.events.append(CompleteRecord(now, flow.id, self._bytes.copy() if not self._last else None))

    def _facts(self, f: Flow, snap: Snapshot) -> FlowFacts:
        per_link = snap.capacity[f.links] / f.weights
        k = int(np.flatnonzero(per_link == per_link.min())[0])
        return FlowFacts(f.id, len(self.rec.facts) + 1, int(f.links[k]), float(f.weights[k]), float(f.size), f.stage,
                         f.request, f.batch, f.deadline, f.downstream, f.layer)


def replay(rec: Recording, mfs_config) -> tuple[DaemonCore, list[tuple[float, str, int, int]]]:
    """Feed the record through a fresh daemon core; returns it and (now, flow, sim queue, daemon queue) rows."""
    ports = tuple(PortSpec(name, float(c)) for name, c in zip(rec.link_ids, rec.capacity))
    # Counters for every port: the replay states the link bytes the simulator moved.
    core = DaemonCore(CoreConfig(ports=ports, mfs=mfs_config, window_bytes=0.0))
    core._counted = [False] * len(ports)  # load comes from the counters below, not from completed messages
    for i in range(len(ports)):
        core.port_counter(i, 0.0, 0.0)
    live: dict[str, FlowFacts] = {}
    rows = []
    for ev in rec.events:
        if isinstance(ev, CompleteRecord):
            facts = live.pop(ev.flow)
            core.complete(facts.msg_id, ev.now)
            if ev.link_bytes is not None:
                _counters(core, ev.link_bytes, ev.now)
            continue
        _counters(core, ev.link_bytes, ev.now)
        for fid, current, done, rem, _ in ev.flows:
            facts = rec.facts[fid]
            batch = core.batches.get(facts.batch)
            if current is not None and (batch is None or batch.current_layer is None or current > batch.current_layer):
                core.layer_begin(facts.batch, current, ev.now)
            if done and (batch is None or not batch.compute_done):
                core.compute_done(facts.batch, ev.now)
            if fid not in live:
                live[fid] = facts
                core.register_request(facts.request, facts.deadline)
                core.batch_formed(facts.batch, [facts.request], ev.now)
                core.submit(facts.msg_id, facts.request, facts.stage, facts.layer, facts.size * facts.weight, ev.now,
                            port=facts.port, downstream=facts.downstream)
            else:
                core.progress(facts.msg_id, (facts.size - rem) * facts.weight, ev.now)
        core._dirty = True  # the simulator asked its policy at this instant: so does the daemon
        core.step(ev.now)
        for fid, _, _, _, q in ev.flows:
            rows.append((ev.now, fid, q, core.messages[rec.facts[fid].msg_id].queue))
    return core, rows


def _counters(core: DaemonCore, link_bytes: np.ndarray, now: float) -> None:
    for i, b in enumerate(link_bytes.tolist()):
        core.port_counter(i, b, now)
