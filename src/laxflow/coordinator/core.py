"""The coordinator's state machine: messages and a clock in, decisions out.

Pure: no sockets, no clock of its own. :mod:`laxflow.coordinator.server`
drives it from one thread: :meth:`CoordinatorCore.handle` for every decoded
frame, :meth:`decide` once a burst of frames is drained, :meth:`tick` every
few hundred ms. Tests drive it the same way with a fake clock.

What it keeps (MFS §5, Appendix B): the daemons it knows (ports with line
rates, liveness, last heartbeat's queue depths), the active batches as each
daemon reported them, and the pruned set. What it computes: Algorithm 1
(:func:`laxflow.policy.inter_request.schedule_table`) over every active
batch, on batch arrival, departure, a daemon's full-state Hello and a daemon
declared dead: never per layer. Many frames drained in one go give one run.

Pruning is sticky, as in :class:`laxflow.policy.mfs.MfsPolicy`: a pruned
request stays in the scavenger class until its batch departs (moving it back
and forth would reorder its messages), its load leaves Algorithm 1's input,
and each run may prune at most ``drop_budget`` more.

A daemon silent for ``dead_after_s`` is declared dead: its batches depart and
its ports leave Algorithm 1, but it stays in the view (``laxflow status``
shows it dead with its last-seen age) until ``forget_after_s`` of silence.

Recovery: a heartbeat from a daemon it does not know (the coordinator
restarted, or the daemon was declared dead), or whose batch count disagrees,
is answered with :class:`ResyncRequest`; the daemon's Hello carries its full
state and replaces what the coordinator held for that node.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import numpy as np

from laxflow.errors import UserError
from laxflow.policy.inter_request import LoadTable, schedule_table
from laxflow.policy.red import robust_effective_deadline
from laxflow.protocol import messages as m
from laxflow.protocol.wire import Envelope


@dataclass(frozen=True)
class CoordinatorConfig:
    """Coordinator knobs; validated once, here."""

    heartbeat_s: float = 0.5  # the period daemons are told to beat at
    dead_after_s: float = 2.0  # silence after which a daemon's batches are dropped
    drop_budget: int = 1  # new prunes per run of Algorithm 1 (0: order only)
    forget_after_s: float = 600.0  # silence after which a dead daemon leaves the view (status)
    coordinator_id: str = ""  # "" -> random per process

    def __post_init__(self) -> None:
        if not self.heartbeat_s > 0:
            raise UserError(f"coordinator: heartbeat must be > 0 s, got {self.heartbeat_s!r}")
        if not self.dead_after_s > self.heartbeat_s:
            raise UserError(f"coordinator: dead-after ({self.dead_after_s!r} s) must exceed the heartbeat ({self.heartbeat_s!r} s)")
        if not self.forget_after_s >= self.dead_after_s:
            raise UserError(f"coordinator: forget-after ({self.forget_after_s!r} s) must be at least dead-after "
                            f"({self.dead_after_s!r} s)")
        if isinstance(self.drop_budget, bool) or not isinstance(self.drop_budget, int) or self.drop_budget < 0:
            raise UserError(f"coordinator: drop budget must be an integer >= 0, got {self.drop_budget!r}")
        if not self.coordinator_id:
            object.__setattr__(self, "coordinator_id", os.urandom(4).hex())


@dataclass(frozen=True)
class Reply:
    """Send ``msg`` to the peer behind ROUTER ``identity``."""

    identity: bytes
    msg: object


@dataclass(frozen=True)
class Publish:
    """Send ``msg`` on PUB."""

    msg: object


@dataclass
class DaemonState:
    node: str
    identity: bytes
    last_seen: float
    ports: dict[str, float] = field(default_factory=dict)
    mode: str = "coordinated"
    queues: tuple[m.QueueDepth, ...] = ()
    reported_batches: int = 0
    resync_sent: float = -1e18
    dead: bool = False  # silent past dead-after: batches dropped, ports out of Algorithm 1, kept for status


class _Batch:
    """One batch merged over the daemons that reported it, with Algorithm 1's
    inputs precomputed on each report (a decision then only concatenates).

    Entries: one per (request, port) end of each transfer; ``e_req`` is the
    request's index in ``request_ids``. Port names map to indices once per
    port epoch (the set of known ports changes only on Hello or death)."""

    __slots__ = ("id", "parts", "request_ids", "deadline", "compute", "e_req", "e_names", "e_load", "_epoch", "_entries", "nodes")

    def __init__(self, batch_id: str) -> None:
        self.id = batch_id
        self.parts: dict[str, m.BatchInfo] = {}
        self.request_ids: list[str] = []
        self.nodes: tuple[str, ...] = ()

    def _rebuild(self) -> None:
        index: dict[str, int] = {}
        deadline: list[float] = []
        e_req: list[int] = []
        names: list[str] = []
        e_load: list[float] = []
        for info in self.parts.values():
            for r in info.requests:
                k = index.get(r.id)
                if k is None:  # the same request reported by two nodes: first report's deadline
                    k = index[r.id] = len(deadline)
                    deadline.append(r.deadline)
                for t in r.traffic:
                    if t.nbytes > 0:
                        e_req += (k, k)
                        names += (t.src, t.dst)
                        e_load += (t.nbytes, t.nbytes)
        self.request_ids = list(index)
        self.nodes = tuple(sorted(self.parts))
        self.deadline = np.array(deadline, dtype=float)
        self.compute = max(i.compute for i in self.parts.values())
        self.e_req = np.array(e_req, dtype=np.int64)
        self.e_names = names
        self.e_load = np.array(e_load, dtype=float)
        self._epoch = -1

    def entries(self, port_index: dict[str, int], epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request index, port index, bytes) of entries on known ports."""
        if self._epoch != epoch:
            idx = np.array([port_index.get(p, -1) for p in self.e_names], dtype=np.int64)
            keep = idx >= 0
            self._entries = (self.e_req[keep], idx[keep], self.e_load[keep])
            self._epoch = epoch
        return self._entries

    def put(self, node: str, info: m.BatchInfo) -> None:
        self.parts[node] = info
        self._rebuild()

    def drop(self, node: str) -> bool:
        """Forget ``node``'s report; True if nobody reports the batch any more."""
        if self.parts.pop(node, None) is None:
            return not self.parts
        if self.parts:
            self._rebuild()
        return not self.parts


class CoordinatorCore:
    """State and Algorithm 1; see the module docstring. One thread only."""

    def __init__(self, config: CoordinatorConfig, now: float) -> None:
        self.config = config
        self.id = config.coordinator_id
        self.started = now
        self.daemons: dict[str, DaemonState] = {}
        self.batches: dict[str, _Batch] = {}
        self.owner: dict[str, str] = {}  # request id -> batch id
        self.pruned: dict[str, None] = {}  # sticky, in pruning order
        self.seq = -1
        self.last: m.Decision | None = None
        self.dirty = False
        self.conflicts = 0  # reports refused (a request already in another batch)
        self.triggers: list[str] = []
        self._more_triggers = 0
        self._port_epoch = 0
        self._port_cache: tuple | None = None
        self._row_cache: dict[str, tuple | None] = {}  # see _rows
        self._row_epoch = -1

    # ------------------------------------------------------------ input

    def handle(self, env: Envelope, identity: bytes, now: float) -> list[Reply | Publish]:
        """Apply one daemon message; returns replies (never a decision: see decide)."""
        msg = env.body
        node = getattr(msg, "node", None)
        if node is None:  # coordinator-bound messages all name their node; others are the loop's
            return []
        known = self.daemons.get(node)
        out: list[Reply | Publish] = []
        if known is None or known.dead:  # new, or back from the dead: its state comes with its Hello
            known = self.daemons[node] = DaemonState(node, identity, now)
            if not isinstance(msg, m.Hello):
                out += self._resync(known, now, "unknown daemon")
        known.identity, known.last_seen = identity, now
        if isinstance(msg, m.Hello):
            self._hello(known, msg)
            out.append(Reply(identity, m.Welcome(self.id, self.config.heartbeat_s, self.config.dead_after_s)))
        elif isinstance(msg, m.Heartbeat):
            known.mode, known.queues, known.reported_batches = msg.mode, msg.queues, msg.batches
            if msg.batches != self._count(node):
                out += self._resync(known, now, "batch count mismatch")
        elif isinstance(msg, m.BatchArrival):
            self._arrive(node, msg.batch)
        elif isinstance(msg, m.BatchDeparture):
            self._depart(node, msg.batch_id)
        return out

    def tick(self, now: float) -> list[Reply | Publish]:
        """Every heartbeat period: declare silent daemons dead, forget long-dead ones, republish."""
        for node, d in list(self.daemons.items()):
            silent = now - d.last_seen
            if d.dead:
                if silent > self.config.forget_after_s:
                    del self.daemons[node]
            elif silent > self.config.dead_after_s:
                d.dead = True
                for bid in [b.id for b in self.batches.values() if node in b.parts]:
                    self._depart(node, bid)
                self._mark(f"dead {node}")
        out: list[Reply | Publish] = []
        if self.last is not None and not self.dirty:
            out.append(Publish(self.last))
        return out

    def decide(self, now: float) -> m.Decision | None:
        """Run Algorithm 1 if anything changed since the last run."""
        if not self.dirty:
            return None
        self.dirty = False
        order, red, finish = self._algorithm1(now)
        self.seq += 1
        batches = self.batches
        self.last = m.Decision(
            coordinator_id=self.id,
            seq=self.seq,
            now=now,
            trigger=", ".join(self.triggers) + (f" +{self._more_triggers}" if self._more_triggers else ""),
            order=tuple([m.BatchRank(b, k, red[b], finish[b], batches[b].nodes) for k, b in enumerate(order)]),
            pruned=tuple(self.pruned),
        )
        self.triggers, self._more_triggers = [], 0
        return self.last

    # ------------------------------------------------------------ state changes

    def _mark(self, trigger: str) -> None:
        self.dirty = True
        if len(self.triggers) < 4:  # what the decision names; the rest is a count
            self.triggers.append(trigger)
        else:
            self._more_triggers += 1

    def _resync(self, d: DaemonState, now: float, reason: str) -> list[Reply | Publish]:
        # One request per dead-after period: the daemon's Hello is on its way.
        if now - d.resync_sent < self.config.dead_after_s / 2:
            return []
        d.resync_sent = now
        return [Reply(d.identity, m.ResyncRequest(self.id, reason))]

    def _hello(self, d: DaemonState, msg: m.Hello) -> None:
        d.ports = {p.port: p.bandwidth for p in msg.ports}
        # Only batches the Hello no longer lists departed; the others are re-put in place so their
        # requests keep their sticky pruning (a resync is not a departure).
        listed = {info.id for info in msg.batches}
        for bid in [b.id for b in self.batches.values() if d.node in b.parts and b.id not in listed]:
            self._depart(d.node, bid)
        for info in msg.batches:
            self._arrive(d.node, info)
        d.reported_batches = len(msg.batches)
        self._mark(f"hello {d.node}")

    def _arrive(self, node: str, info: m.BatchInfo) -> None:
        for r in info.requests:
            other = self.owner.get(r.id)
            if other is not None and other != info.id:
                self.conflicts += 1  # counted, reported in status; the daemon's heartbeat will resync it
                return
        batch = self.batches.get(info.id)
        if batch is None:
            batch = self.batches[info.id] = _Batch(info.id)
        old = set(batch.request_ids)
        batch.put(node, info)
        self._row_cache[info.id] = None  # rebuilt at the next run (a new batch goes last, as in self.batches)
        for r in info.requests:
            self.owner[r.id] = info.id
        for r in old - set(batch.request_ids):
            self._forget(r)
        self._mark(f"arrival {info.id}")

    def _depart(self, node: str, batch_id: str) -> None:
        batch = self.batches.get(batch_id)
        if batch is None:
            return
        old = set(batch.request_ids)
        if batch.drop(node):
            del self.batches[batch_id]
            self._row_cache.pop(batch_id, None)
            gone = old
        else:
            self._row_cache[batch_id] = None
            gone = old - set(batch.request_ids)
        for r in gone:
            self._forget(r)
        self._mark(f"departure {batch_id}")

    def _forget(self, request_id: str) -> None:
        self.owner.pop(request_id, None)
        self.pruned.pop(request_id, None)

    def _count(self, node: str) -> int:
        return sum(1 for b in self.batches.values() if node in b.parts)

    # ------------------------------------------------------------ Algorithm 1

    def ports(self) -> dict[str, float]:
        """Line rates of the live daemons' ports (a dead daemon's leave Algorithm 1)."""
        out: dict[str, float] = {}
        for d in self.daemons.values():
            if not d.dead:
                out.update(d.ports)
        return out

    def _port_table(self) -> tuple[list[str], dict[str, int], np.ndarray]:
        bw = self.ports()
        if self._port_cache is None or self._port_cache[0] != bw:
            ids = sorted(bw)
            self._port_epoch += 1
            self._port_cache = (bw, ids, {p: i for i, p in enumerate(ids)}, np.array([bw[p] for p in ids], dtype=float))
        _, ids, index, bandwidth = self._port_cache
        return ids, index, bandwidth

    def _rows(self, port_index: dict[str, int], epoch: int) -> dict[str, tuple]:
        """Algorithm 1's input row of every batch, (id, compute, request ids, deadlines, entry request,
        entry port, entry bytes), kept across decisions: a report changes one batch's row, not 1,000.
        Same order as ``self.batches`` (a re-reported batch keeps its place in both dicts)."""
        rows = self._row_cache
        if self._row_epoch != epoch or len(rows) != len(self.batches) or rows.keys() != self.batches.keys():
            rows.clear()
            rows.update((bid, None) for bid in self.batches)
            self._row_epoch = epoch
        for bid, row in rows.items():
            if row is None:
                b = self.batches[bid]
                rows[bid] = (b.id, b.compute, b.request_ids, b.deadline, *b.entries(port_index, epoch))
        return rows

    def _without_pruned(self, row: tuple, scavenged: list[_Batch]) -> tuple | None:
        """A batch's row without its pruned requests; None (and the batch in ``scavenged``) if none is left."""
        bid, compute, ids, dl, req, port, load = row
        pruned = self.pruned
        alive = np.array([r not in pruned for r in ids], dtype=bool)
        if not alive.any():
            scavenged.append(self.batches[bid])
            return None
        renum = np.cumsum(alive) - 1
        keep = alive[req]
        return (bid, compute, [r for r, a in zip(ids, alive) if a], dl[alive], renum[req[keep]], port[keep], load[keep])

    def _algorithm1(self, now: float) -> tuple[list[str], dict[str, float], dict[str, float]]:
        """Build Algorithm 1's arrays from the batch cache and run it.

        Pruned requests are left out (they are scavenged already); a batch
        left with no request goes last, ordered by its RED."""
        _, port_index, bandwidth = self._port_table()
        epoch = self._port_epoch
        pruned = self.pruned
        touched = {self.owner[r] for r in pruned if r in self.owner}  # batches with a pruned request
        scavenged: list[_Batch] = []
        rows = list(self._rows(port_index, epoch).values())  # in self.batches order, as before
        if touched:
            rows = [self._without_pruned(r, scavenged) if r[0] in touched else r for r in rows]
            rows = [r for r in rows if r is not None]
        order: list[str] = []
        red: dict[str, float] = {}
        finish: dict[str, float] = {}
        if rows:
            batch_ids, compute, ids_of, deadline, e_req, e_port, e_load = (list(c) for c in zip(*rows))
            counts = np.fromiter(map(len, ids_of), dtype=np.int64, count=len(ids_of))
            base = np.cumsum(counts) - counts  # first request index of each batch
            entries = np.fromiter(map(len, e_req), dtype=np.int64, count=len(e_req))
            request_ids = list(itertools.chain.from_iterable(ids_of))
            result = schedule_table(
                LoadTable(
                    now=now,
                    # no port known: nothing to prune by (and Algorithm 1 needs a port to pick)
                    drop_budget=self.config.drop_budget if bandwidth.size else 0,
                    bandwidth=bandwidth,
                    batch_ids=batch_ids,
                    compute=np.array(compute, dtype=float),
                    request_ids=request_ids,
                    request_batch=np.repeat(np.arange(len(batch_ids)), counts),
                    deadline=np.concatenate(deadline),
                    entry_request=np.concatenate(e_req) + np.repeat(base, entries),
                    entry_port=np.concatenate(e_port),
                    entry_load=np.concatenate(e_load),
                )
            )
            order, red, finish = result.order, result.red, result.finish
            for r in result.pruned:
                self.pruned[r] = None
        tail = sorted((robust_effective_deadline(b.deadline).red, b.id, b) for b in scavenged)
        for value, bid, b in tail:
            order.append(bid)
            red[bid] = value
            finish[bid] = now + b.compute
        return order, red, finish

    # ------------------------------------------------------------ status

    def status(self, now: float, detail: bool, latency: m.LatencySummary, dropped: dict[str, int], auth: str = "",
               handshake_failures: dict[str, int] | None = None) -> m.StatusResponse:
        """What ``laxflow status`` shows; built on the loop's thread (``auth`` and the handshake
        failures are the server's, which owns the sockets)."""
        ranks = {r.batch_id: r for r in self.last.order} if self.last else {}
        daemons = tuple(
            m.DaemonStatus(
                node=d.node,
                alive=not d.dead and now - d.last_seen <= self.config.dead_after_s,
                heartbeat_age=max(now - d.last_seen, 0.0),
                batches=self._count(d.node),
                mode=d.mode,
                ports=tuple(m.PortInfo(p, bw) for p, bw in sorted(d.ports.items())),
                queues=d.queues,
            )
            for d in sorted(self.daemons.values(), key=lambda d: d.node)
        )
        batches: tuple[m.BatchStatus, ...] = ()
        if detail:
            rows = []
            for b in self.batches.values():
                r = ranks.get(b.id)
                rows.append(
                    m.BatchStatus(b.id, tuple(sorted(b.parts)), len(b.request_ids), b.compute,
                                  r.rank if r else -1, r.red if r else 0.0, r.finish if r else 0.0)
                )
            batches = tuple(sorted(rows, key=lambda s: (s.rank < 0, s.rank, s.id)))
        return m.StatusResponse(
            coordinator_id=self.id,
            started=self.started,
            now=now,
            seq=self.seq,
            daemons=daemons,
            batches=batches,
            active_batches=len(self.batches),
            active_requests=len(self.owner),
            pruned=tuple(self.pruned),
            latency=latency,
            dropped=dropped,
            auth=auth,
            handshake_failures=dict(handshake_failures or {}),
        )
