"""The node daemon's core: a pure state machine.

Events and a clock go in; permits, batch reports for the coordinator and
metrics come out. No I/O, no threads, no wall clock: the daemon's loop
(:mod:`laxflow.daemon.service`) calls it on its one loop thread with
``time.monotonic()``, tests call it with a fake clock, and the replay of a
simulator run calls it with the simulator's clock.

Inputs:

* shim and adapter events from the shared-memory ring (:meth:`ingest`, numpy
  records of ``EVENT_DTYPE``): SUBMIT, COMPLETION, LAYER_BOUNDARY;
* hooks calls (:meth:`register_request`, :meth:`batch_formed`,
  :meth:`layer_begin`, :meth:`submit`, :meth:`progress`, :meth:`complete`,
  :meth:`request_done`);
* the coordinator's decisions (:meth:`apply_order`);
* port byte counters (:meth:`port_counter`).

:meth:`step` then runs the policy if anything changed (or a policy timer is
due) and the permit rule (:mod:`laxflow.daemon.gate`) per port.

One policy object (``MfsPolicy`` by default) schedules every port of the
node: a message is a :class:`~laxflow.policy.flow.Flow` with ``links =
[its port's index]``, the Snapshot's capacities are the ports' line rates and
its ``link_load`` the :class:`~laxflow.daemon.ports.LinkMeter`'s EWMA, whose
window is the policy's ``load_window``. Levels therefore change only where
the policy changes them: at layer boundaries and on the stage-3 period.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from laxflow.daemon.gate import grants, spare_grants
from laxflow.daemon.ports import LinkMeter, PortSpec
from laxflow.daemon.state import BatchInfo, BatchReport, Message, PermitChange, RequestInfo, StepResult
from laxflow.errors import UserError
from laxflow.policy.base import Snapshot
from laxflow.policy.config import MfsConfig
from laxflow.policy.flow import STAGE_OF_CODE, Flow, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.protocol.shm import COMPUTE_DONE_LAYER  # a LAYER_BOUNDARY meaning "prefill compute ended"

EV_SUBMIT, EV_COMPLETION, EV_LAYER_BOUNDARY = 1, 2, 3
_EVENT_FIELDS = ("kind", "pid", "msg_id", "request_id", "bytes", "t_ns", "stage", "layer", "handle")
GATE_OPEN = 1


@dataclass(frozen=True)
class CoreConfig:
    """What the core needs, validated once.

    ``window_bytes``: the permit rule's work-conserving window per port; None
    means one bandwidth-delay product, ``rate * rtt``. ``spare_share``: the
    rule's spare-capacity grant (:mod:`laxflow.daemon.gate`) on ports with a
    byte counter: when at least this share of the line rate went unused in
    every counter interval of a stretch since the port's last grant, its
    highest-ranked waiting messages go; None: never. The stretch lasts
    ``spare_quiet`` seconds, and at least the time ``spare_burst`` bytes take
    at the port's line rate: a NIC or veth counts a GSO/TSO super-packet (up
    to 64 KiB) when it takes it, so a saturated port's counter stands still
    between its super-packets (5.2 ms each at 100 Mbit/s). ``default_port``:
    the port of shim messages whose (pid, handle) was never bound to one.
    """

    ports: tuple[PortSpec, ...]
    mfs: MfsConfig = field(default_factory=MfsConfig)
    rtt: float = 20e-6
    window_bytes: float | None = None
    spare_share: float | None = 0.25
    spare_quiet: float = 0.002
    spare_burst: float = 65536.0
    default_port: int = 0
    batch_idle: float = 1.0  # s without messages after which a batch departs
    message_ttl: float = 60.0  # s after its SUBMIT a message never completed is forgotten (its job died)

    def __post_init__(self) -> None:
        if not self.ports:
            raise UserError("daemon config: at least one port is required")
        if len({p.name for p in self.ports}) != len(self.ports):
            raise UserError("daemon config: port names must be unique")
        if not (math.isfinite(self.rtt) and self.rtt > 0):
            raise UserError(f"daemon config: rtt must be a number of seconds > 0, got {self.rtt!r}")
        if self.window_bytes is not None and not (math.isfinite(self.window_bytes) and self.window_bytes >= 0):
            raise UserError(f"daemon config: window_bytes must be >= 0 bytes, got {self.window_bytes!r}")
        if self.spare_share is not None and (isinstance(self.spare_share, bool)
                                             or not (isinstance(self.spare_share, (int, float)) and 0 < self.spare_share <= 1)):
            raise UserError(f"daemon config: spare_share must be a share of the line rate in (0, 1] or null, "
                            f"got {self.spare_share!r}")
        for name in ("spare_quiet", "spare_burst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
                raise UserError(f"daemon config: {name} must be a number >= 0, got {value!r}")
        if not 0 <= self.default_port < len(self.ports):
            raise UserError(f"daemon config: default_port must be 0..{len(self.ports) - 1}, got {self.default_port}")
        if not (math.isfinite(self.batch_idle) and self.batch_idle > 0):
            raise UserError(f"daemon config: batch_idle must be > 0 s, got {self.batch_idle!r}")
        if not (math.isfinite(self.message_ttl) and self.message_ttl > 0):
            raise UserError(f"daemon config: message_ttl must be > 0 s, got {self.message_ttl!r}")


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class DaemonCore:
    """Per-node scheduling state. Every method runs on the daemon's loop thread."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.ports = config.ports
        self.port_index = {p.name: i for i, p in enumerate(config.ports)}
        self.capacity = np.array([p.rate for p in config.ports], dtype=float)
        self.window = (
            self.capacity * config.rtt if config.window_bytes is None else np.full(len(self.ports), config.window_bytes)
        )
        for i, p in enumerate(config.ports):
            if p.window is not None:
                self.window[i] = p.window  # the port's own (ports file)
        self.policy = MfsPolicy(config.mfs)
        self.levels = config.mfs.levels
        self.meter = LinkMeter(self.capacity, config.mfs.load_window)
        # A message's Flow uses one port with weight 1: share one read-only (links, weights) pair per port
        # instead of two new arrays per submit.
        self._usage = [(_frozen(np.array([p], dtype=np.int64)), _frozen(np.ones(1))) for p in range(len(self.ports))]
        self.messages: dict[int, Message] = {}  # live, in submission order
        self.requests: dict[str, RequestInfo] = {}
        self.batches: dict[str, BatchInfo] = {}
        # Requests whose record outlives its batch (registered, or kept at the batch's departure because
        # their deadline is ahead): forgotten once no deadline of theirs is ahead (_forget_orphans).
        self._orphans: set[str] = set()
        self._orphans_swept = -math.inf
        self.handle_port: dict[tuple[int, int], int] = {}
        self.completed_bytes = np.zeros(len(self.ports))  # bytes of messages seen done, per port
        self._counted = [p.counter is None for p in config.ports]  # meter fed from completions
        # Ports where the permit rule may grant into spare capacity: those with their own byte counter (a
        # meter fed from completions sees no bytes while they move): the utilization at or below which an
        # interval has spare capacity, how long such a stretch must last, and per port the current stretch
        # since the last grant ((start, last sample), None: none).
        self._spare_at = [None if p.counter is None or config.spare_share is None else 1.0 - config.spare_share
                          for p in config.ports]
        self._spare_span = [max(config.spare_quiet, config.spare_burst / p.rate) for p in config.ports]
        self._quiet: list[tuple[float, float] | None] = [None] * len(config.ports)
        self._dirty = False
        self._regate = False
        self._timer: float | None = None
        self._permits: list[PermitChange] = []
        self._cleared: list[int] = []
        self._reports: list[BatchReport] = []
        self._arrivals: list[BatchInfo] = []
        self.coordinated = False
        self.stats = {"submits": 0, "completions": 0, "layer_boundaries": 0, "bad_events": 0, "permits": 0,
                      "spare_permits": 0, "decisions": 0, "unknown_completions": 0, "duplicate_submits": 0,
                      "expired_messages": 0}

    # ------------------------------------------------------------ shm events

    def ingest(self, events: np.ndarray) -> None:
        """Apply a batch of ring events (``EVENT_DTYPE`` records), oldest first."""
        if not len(events):
            return
        if events.dtype.names == _EVENT_FIELDS:
            rows = events.tolist()  # one call: the tuples come in _event's argument order
        else:
            rows = zip(*[events[name].tolist() for name in _EVENT_FIELDS])
        for row in rows:
            try:
                self._event(*row)
            except (UserError, ValueError, OverflowError):
                self.stats["bad_events"] += 1  # one bad event costs itself, never the rest of the batch

    def _event(self, kind: int, pid: int, msg_id: int, request: int, nbytes: int, t_ns: int, stage: int, layer: int,
               handle: int) -> None:
        now = t_ns * 1e-9
        if kind == EV_SUBMIT:
            port = self.handle_port.get((pid, handle), self.config.default_port)
            self.submit(msg_id, str(request), STAGE_OF_CODE.get(stage), layer, nbytes, now, port=port, pid=pid)
        elif kind == EV_COMPLETION:
            self.complete(msg_id, now)
        elif kind == EV_LAYER_BOUNDARY:
            if layer == COMPUTE_DONE_LAYER:
                self.compute_done(self.request(str(request)).batch, now)
            else:
                self.layer_begin(self.request(str(request)).batch, layer, now)
        else:
            self.stats["bad_events"] += 1

    def bind_handle(self, pid: int, handle: int, port: str | int) -> None:
        """Say which port a process's QP or socket sends on (hooks, adapters)."""
        self.handle_port[(pid, handle)] = self._port(port)

    # ------------------------------------------------------------ requests and batches

    def request(self, name: str) -> RequestInfo:
        """The request's record, created on first sight (its own batch until told otherwise)."""
        info = self.requests.get(name)
        if info is None:
            info = self.requests[name] = RequestInfo(name, batch=name)
        return info

    def register_request(self, name: str, deadline: float | None, prompt_tokens: int = 0, reused_tokens: int = 0,
                         priority: int = 0) -> None:
        info = self.request(name)
        info.deadline, info.prompt_tokens, info.reused_tokens, info.priority = deadline, prompt_tokens, reused_tokens, priority
        if info.batch not in self.batches:
            self._orphans.add(name)  # no batch yet: if none ever comes, its deadline ends the record

    def batch_formed(self, batch: str, requests: Iterable[str], now: float, compute: float = 0.0,
                     traffic: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """A prefill batch starts: its requests, its compute estimate (s), its expected bytes per port and request."""
        info = self._batch(batch, now)
        info.compute = compute
        info.announced = True
        info.last_seen = max(info.last_seen, now)
        if info.current_layer is None:
            # MFS's L_curr is the layer "being computed or waiting to be computed": a formed batch waits to
            # compute layer 0, so its reads count their RLI from there (the simulator's batches do the same).
            self._set_layer(info, 0)
        for name in requests:
            self.request(name).batch = batch
            info.requests.add(name)
        for port, per_request in (traffic or {}).items():
            row = info.traffic.setdefault(self.ports[self._port(port)].name, {})
            for name, nbytes in per_request.items():
                row[name] = row.get(name, 0.0) + float(nbytes)
        self._dirty = True

    def layer_begin(self, batch: str, layer: int, now: float) -> None:
        """The batch computes ``layer`` now: its messages' RLI counts from here."""
        info = self._batch(batch, now)
        info.last_seen = max(info.last_seen, now)  # computing is activity: the idle rule counts from here
        self.stats["layer_boundaries"] += 1
        if info.current_layer is not None and layer <= info.current_layer:
            return  # promotion is monotonic: a repeated or late boundary changes nothing
        self._set_layer(info, layer)

    def _set_layer(self, info: BatchInfo, layer: int) -> None:
        """The batch's current layer, on it and on its live messages' flows; the policy decides again."""
        info.current_layer = layer
        for m in self._live_of(info.name):
            m.flow.current_layer = layer
        self._dirty = True

    def compute_done(self, batch: str, now: float) -> None:
        """The batch's prefill compute ended: its stage-3 messages promote on the period."""
        info = self._batch(batch, now)
        info.compute_done = True
        for m in self._live_of(batch):
            m.flow.compute_done = True
        self._dirty = True

    def request_done(self, name: str, now: float) -> None:
        """The request's first token is out: it leaves its batch (the batch departs with its last request)."""
        info = self.requests.get(name)
        if info is None:
            return
        info.done = True
        batch = self.batches.get(info.batch)
        if batch is None:  # no live batch holds it: nothing to wait for
            del self.requests[name]
            self._orphans.discard(name)
            return
        if batch.requests and all(self.request(r).done for r in batch.requests):
            batch.finished = True
            self._maybe_depart(batch, now)

    # ------------------------------------------------------------ messages

    def submit(self, msg_id: int, request: str, stage: Stage | None, layer: int | None, nbytes: float, now: float,
               port: int | str | None = None, pid: int = 0, downstream: float = 0.0) -> None:
        """A message wants to go: it waits for a permit from the next :meth:`step`."""
        if msg_id in self.messages or msg_id == 0:
            self.stats["duplicate_submits" if msg_id else "bad_events"] += 1
            return
        self.stats["submits"] += 1
        req = self.request(request)
        batch = self._batch(req.batch, now)
        batch.requests.add(request)
        p = self.config.default_port if port is None else self._port(port)
        size = max(float(nbytes), 1.0)  # unknown size (0): one byte, i.e. only its level means anything
        links, weights = self._usage[p]
        flow = Flow(
            id=str(msg_id), size=size, links=links, weights=weights, arrival=now,
            stage=Stage.REUSE if stage is None else stage, request=request, batch=req.batch, deadline=req.deadline,
            downstream=downstream, layer=None if stage is None else layer, current_layer=batch.current_layer,
            compute_done=batch.compute_done,
        )
        self.messages[msg_id] = Message(msg_id, p, request, req.batch, size, now, pid, flow)
        batch.live += 1
        batch.last_seen = now
        row = batch.submitted.setdefault(self.ports[p].name, {})
        row[request] = row.get(request, 0.0) + size
        self._dirty = True

    def progress(self, msg_id: int, bytes_done: float, now: float) -> None:
        """A transport reports how many of the message's bytes are done (cumulative)."""
        m = self.messages.get(msg_id)
        if m is None:
            return
        done = min(m.size, max(m.done, float(bytes_done)))
        self._account(m.port, done - m.done, now)
        m.done = done
        self._regate = True  # fewer bytes ahead: maybe a grant; levels change only at decisions

    def complete(self, msg_id: int, now: float) -> None:
        """The message's last byte is out: it leaves the queue and its permit is cleared."""
        m = self.messages.pop(msg_id, None)
        if m is None:
            self.stats["unknown_completions"] += 1
            return
        self.stats["completions"] += 1
        self._retire(m, now)

    def _retire(self, m: Message, now: float) -> None:
        """A message left the queue (completed or expired): its bytes, its permit slot, its batch."""
        self._account(m.port, m.size - m.done, now)
        self.policy.on_complete(m.flow, now)
        self._cleared.append(m.msg_id)
        batch = self.batches.get(m.batch)
        if batch is not None:
            batch.live -= 1
            batch.last_seen = now
            if batch.live == 0:
                self._dirty = True  # the policy re-ranks batches on a batch's departure
            self._maybe_depart(batch, now)
        self._regate = True

    def port_counter(self, port: int | str, total_bytes: float, now: float) -> None:
        """A port's cumulative transmitted bytes (sysfs ``tx_bytes``), for its link
        load and the permit rule's spare capacity."""
        p = self._port(port)
        last, _ = self.meter.last_sample(p)  # where the interval this sample closes began
        u = self.meter.sample(p, total_bytes, now)
        at = self._spare_at[p]
        if u is None or at is None:  # no interval closed (the first sample, or no time passed), or no spare rule
            return
        if u > at:
            self._quiet[p] = None
            return
        quiet = self._quiet[p]
        start = last if quiet is None else quiet[0]
        self._quiet[p] = (start, now)
        if now - start >= self._spare_span[p] and not self._regate:
            self._regate = any(m.port == p and m.granted is None for m in self.messages.values())

    # ------------------------------------------------------------ coordinator

    def apply_order(self, order: Mapping[str, int], pruned: Iterable[str]) -> None:
        """The coordinator's RED ranks and pruned requests (scavenger class)."""
        self.policy.set_order(order, pruned)
        self.coordinated = True
        self._dirty = True

    def pruned(self) -> set[str]:
        return self.policy.pruned_requests

    # ------------------------------------------------------------ output

    def step(self, now: float) -> StepResult:
        """Decide if needed, grant what the permit rule allows; hand out what changed since the last step."""
        decided = False
        self._expire_messages(now)
        if self._dirty or (self._timer is not None and now >= self._timer):
            self._decide(now)
            decided = True
        elif self._regate:
            self._regate = False
            self._gate(now)
        self._idle_departures(now)
        for info in self._arrivals:
            self._report_arrival(info, now)
        self._arrivals.clear()
        out = StepResult(self._permits, self._cleared, self._reports, self._timer, decided)
        self._permits, self._cleared, self._reports = [], [], []
        return out

    def open_all(self, now: float) -> list[PermitChange]:
        """Shutdown: every waiting message gets an open gate at its current level (nothing is held)."""
        out = []
        for m in self.messages.values():
            if m.granted is None:
                m.granted = now
                out.append(PermitChange(m.msg_id, GATE_OPEN, m.level, m.dscp, m.port, now - m.submitted))
        return out

    def queue_depths(self) -> dict[tuple[str, int], int]:
        """Messages waiting for a permit per (port, RMLQ level)."""
        out: dict[tuple[str, int], int] = {}
        for m in self.messages.values():
            if m.granted is None:
                key = (self.ports[m.port].name, m.level)
                out[key] = out.get(key, 0) + 1
        return out

    # ------------------------------------------------------------ internals

    def _decide(self, now: float) -> None:
        self._dirty = self._regate = False
        live = list(self.messages.values())
        if not live:
            self._timer = None
            return
        flows = [m.flow for m in live]
        remaining = np.fromiter((m.size - m.done for m in live), float, len(live))
        snap = Snapshot(now=now, flows=flows, remaining=remaining, capacity=self.capacity, link_load=self.meter.loads(),
                        load_window=self.meter.window)
        decision = self.policy.decide(snap)
        self.stats["decisions"] += 1
        self._timer = min(decision.timers) if decision.timers else None
        rank = np.asarray(decision.level, dtype=np.int64)
        for m, q, d, r in zip(live, decision.queue.tolist(), decision.dscp.tolist(), rank.tolist()):
            if m.granted is None:  # a granted message keeps the level and DSCP it went with
                m.level, m.dscp = q, d
            m.rank, m.queue = r, q
        self._gate(now)

    def _gate(self, now: float) -> None:
        """The permit rule on every port with a waiting message, with the ranks of the last decision."""
        by_port: dict[int, list] = {}
        for m in self.messages.values():
            by_port.setdefault(m.port, []).append(m)
        for p, ms in by_port.items():
            if all(m.granted is not None for m in ms):
                continue
            ok = grants([m.rank for m in ms], [m.size - m.done for m in ms], [m.granted is None for m in ms],
                        float(self.window[p]))
            spare = False
            if not any(ok):
                quiet = self._quiet[p]
                if quiet is None or quiet[1] - quiet[0] < self._spare_span[p]:
                    continue
                ok, spare = spare_grants([m.rank for m in ms], [m.granted is None for m in ms]), True
                self.stats["spare_permits"] += sum(ok)
            # What was just granted is not in the counter yet: spare capacity is measured anew from now.
            self._quiet[p] = (now, now)
            for m, go in zip(ms, ok):
                if go:
                    m.granted, m.spare = now, spare
                    self.stats["permits"] += 1
                    self._permits.append(PermitChange(m.msg_id, GATE_OPEN, m.level, m.dscp, m.port, now - m.submitted,
                                                      spare))

    def _account(self, port: int, nbytes: float, now: float) -> None:
        self.completed_bytes[port] += nbytes
        if self._counted[port]:
            self.meter.sample(port, self.completed_bytes[port], now)

    def _batch(self, name: str, now: float) -> BatchInfo:
        info = self.batches.get(name)
        if info is None:
            info = self.batches[name] = BatchInfo(name, arrived=now, last_seen=now)
            self._arrivals.append(info)  # reported at the next step, once its requests are known
        return info

    def _live_of(self, batch: str) -> list[Message]:
        return [m for m in self.messages.values() if m.batch == batch]

    def _maybe_depart(self, batch: BatchInfo, now: float) -> None:
        # Compute end is not the batch's end: its last layer's KV write is submitted after it, and
        # departing in between dropped the request records, so that write came without its deadline.
        # A batch ends when its requests are done, or on idleness (``_idle_departures``).
        if batch.live == 0 and batch.finished:
            self._depart(batch, now)

    def _expire_messages(self, now: float) -> None:
        """Forget messages live for ``message_ttl`` since their SUBMIT: their COMPLETION is not coming (the
        job died, or the event was dropped on a full ring), and their bytes would hold lower levels forever."""
        limit = now - self.config.message_ttl
        expired = []
        for m in self.messages.values():  # in submission order: stop at the first one still young
            if m.submitted > limit:
                break
            expired.append(m)
        for m in expired:
            self.stats["expired_messages"] += 1
            self._retire(self.messages.pop(m.msg_id), now)

    def _idle_departures(self, now: float) -> None:
        limit = self.config.batch_idle
        idle = [b for b in self.batches.values() if b.live == 0 and now - b.last_seen >= limit and self._expired(b, now)]
        for b in idle:
            self._depart(b, now)
        if self._orphans and now - self._orphans_swept >= limit / 2:
            self._forget_orphans(now)

    def _deadline_passed(self, info: RequestInfo, now: float) -> bool:
        return info.deadline is None or now - info.deadline >= self.config.batch_idle

    def _forget_orphans(self, now: float) -> None:
        """Drop records of requests no live batch holds and whose deadline (if any) passed ``batch_idle`` ago:
        the engine went away without saying they were done."""
        self._orphans_swept = now
        for name in list(self._orphans):
            info = self.requests.get(name)
            if info is None or info.batch in self.batches:
                self._orphans.discard(name)  # gone, or a live batch's again: its departure decides
            elif self._deadline_passed(info, now):
                del self.requests[name]
                self._orphans.discard(name)

    def _expired(self, batch: BatchInfo, now: float) -> bool:
        """Whether an idle batch is gone rather than waiting.

        A batch seen only through shim events departs after ``batch_idle``
        without messages. A batch the engine announced (hooks
        ``batch_formed``) may compute for longer than that before its first
        message or between two; it ends on ``request_done`` (not at compute end: its last KV write follows),
        and departs on idleness only ``batch_idle`` past its last deadline
        too (the engine went away). Departing it early made the coordinator
        drop it -- and its sticky pruned requests -- while it was still live."""
        if not batch.announced:
            return True
        return all(self._deadline_passed(self.requests[r], now) for r in batch.requests if r in self.requests)

    def _report_arrival(self, batch: BatchInfo, now: float) -> None:
        if not batch.reported:
            batch.reported = True
            self._reports.append(self._report("arrival", batch, now))

    def _depart(self, batch: BatchInfo, now: float) -> None:
        self.batches.pop(batch.name, None)
        self.policy.forget((batch.name,))  # its tables stay as large as the most batches live at once
        self._report_arrival(batch, now)
        self._reports.append(self._report("departure", batch, now))
        for name in batch.requests:
            info = self.requests.get(name)
            if info is None or info.batch != batch.name:
                continue
            if info.done or batch.compute_done or self._deadline_passed(info, now):
                del self.requests[name]
                self._orphans.discard(name)
            else:
                self._orphans.add(name)  # its deadline is ahead: it may send again (kept until it passes)

    def _report(self, kind: str, batch: BatchInfo, now: float) -> BatchReport:
        deadlines = {r: self.requests[r].deadline for r in sorted(batch.requests) if r in self.requests}
        return BatchReport(kind, batch.name, now, deadlines, batch.compute, batch.expected_traffic())

    def _port(self, port: int | str) -> int:
        if isinstance(port, str):
            try:
                return self.port_index[port]
            except KeyError:
                raise UserError(f"unknown port {port!r} (this node has {', '.join(self.port_index)})") from None
        if not 0 <= int(port) < len(self.ports):
            raise UserError(f"port index {port} out of range (this node has {len(self.ports)} ports)")
        return int(port)
