"""Typed messages of the control plane (MFS §5, Appendix B).

Sockets (see :mod:`laxflow.coordinator.client` for how to open them):

- daemon DEALER -> coordinator ROUTER (``--bind`` address): :class:`Hello`,
  :class:`Heartbeat`, :class:`BatchArrival`, :class:`BatchDeparture`.
- coordinator ROUTER -> that daemon: :class:`Welcome` (answer to Hello),
  :class:`ResyncRequest` (a heartbeat from a daemon the coordinator does not
  know, e.g. after the coordinator restarted: the daemon answers with Hello
  carrying its full state).
- coordinator PUB (ROUTER port + 1) -> every daemon SUB: :class:`Decision`,
  the whole order and pruned set each time (idempotent; a daemon that missed
  one loses nothing), republished every heartbeat period for late joiners.
- ``laxflow status`` DEALER -> ROUTER: :class:`StatusRequest`, answered by
  :class:`StatusResponse`.

Units: times are wall-clock seconds (``time.time()``; nodes are assumed NTP
synchronised, as deadlines are compared across nodes), durations seconds,
sizes bytes, bandwidth bytes/s. Ids are non-empty strings of at most 256
characters. Port ids are cluster-wide (convention ``<node>/<device>``).
Batch and request ids are cluster-wide; a batch that spans nodes (EP/SP
across nodes) is reported by each node's daemon with that node's traffic, and
the coordinator merges the reports.

Every class is frozen; :mod:`laxflow.protocol.wire` checks field types and
then calls ``validate()`` for value rules (ValueError -> ``bad_field``).

Every count is bounded to what a real request can have (the bounds below;
every integer field is also within int64): a value past its bound is a bug
or an attack, refused as ``bad_field`` with one line naming the field, the
value and the bound, and counted by the receiver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laxflow.protocol.schema import MAX_ID_LEN, message

HELLO_REASONS = ("start", "reconnect", "resync")
DAEMON_MODES = ("coordinated", "local")
# How the coordinator admits peers (StatusResponse.auth): CURVE keys; no keys on loopback (any local process
# can register); no keys off loopback with --insecure (any host that reaches the port can).
AUTH_MODES = ("curve", "none-loopback", "none-insecure")

# Bounds of what a real request can have (also used by laxflow.protocol.hooks).
MAX_TOKENS = 1 << 24  # tokens of one prompt: 16.7 M; the longest context windows today are ~10 M
MAX_LAYER = 4095  # a layer index: the deepest models have a few hundred layers
MAX_BYTES = 1 << 50  # bytes of one transfer, message or queue (1 PiB)
MAX_BANDWIDTH = 1 << 50  # bytes/s of one port (1 PB/s; an 800 Gb/s NIC is 1e11)
MAX_COUNT = 1 << 32  # messages, batches or requests one daemon holds
MAX_LEVEL = 255  # an RMLQ level (the permit table stores it in one byte)
MAX_SECONDS = 86_400.0  # a duration (compute left, a period): a day
INT64_MAX = (1 << 63) - 1  # sequence numbers and ids


def bounded(value: float, what: str, low: float, high: float) -> None:
    """ValueError naming ``what``, the value and the bound unless ``low <= value <= high``."""
    if not low <= value <= high:
        raise ValueError(f"{what} {value!r} is out of bounds: expected {_num(low)}..{_num(high)}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _ident(value: str, what: str) -> None:
    if not value or len(value) > MAX_ID_LEN:
        raise ValueError(f"{what} must be 1..{MAX_ID_LEN} characters, got {len(value)}")


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class PortInfo:
    """One NIC port of a node and its line rate."""

    port: str  # cluster-wide id, e.g. "node1/mlx5_0"
    bandwidth: float  # bytes/s

    def validate(self) -> None:
        _ident(self.port, "port")
        if self.bandwidth <= 0:
            raise ValueError(f"port {self.port!r} bandwidth must be > 0, got {self.bandwidth!r}")
        bounded(self.bandwidth, f"port {self.port!r} bandwidth", 0, MAX_BANDWIDTH)


@dataclass(frozen=True)
class Transfer:
    """One entry of a request's traffic matrix: ``nbytes`` from port ``src``
    to port ``dst``. Algorithm 1's load vector adds ``nbytes`` to both ports
    (a port whose bandwidth no daemon reported is left out of the check)."""

    src: str
    dst: str
    nbytes: float

    def validate(self) -> None:
        _ident(self.src, "transfer src")
        _ident(self.dst, "transfer dst")
        bounded(self.nbytes, "transfer nbytes", 0, MAX_BYTES)


@dataclass(frozen=True)
class RequestInfo:
    """One request of a batch, as Algorithm 1 needs it."""

    id: str
    deadline: float  # absolute TTFT deadline, wall clock s
    prompt_tokens: int
    reused_tokens: int  # tokens whose KV is fetched from elsewhere (stage 1)
    traffic: tuple[Transfer, ...]  # this request's remaining traffic on this node's ports

    def validate(self) -> None:
        _ident(self.id, "request id")
        bounded(self.prompt_tokens, f"request {self.id!r} prompt_tokens", 0, MAX_TOKENS)
        bounded(self.reused_tokens, f"request {self.id!r} reused_tokens", 0, MAX_TOKENS)


@dataclass(frozen=True)
class BatchInfo:
    """A prefill batch as one daemon sees it."""

    id: str
    compute: float  # s of compute the batch still needs (profiled estimate)
    requests: tuple[RequestInfo, ...]

    def validate(self) -> None:
        _ident(self.id, "batch id")
        bounded(self.compute, f"batch {self.id!r} compute", 0, MAX_SECONDS)
        if not self.requests:
            raise ValueError(f"batch {self.id!r} has no requests")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"batch {self.id!r} lists a request twice")


@dataclass(frozen=True)
class QueueDepth:
    """Messages waiting for a permit on one RMLQ level of one port."""

    port: str
    level: int  # 0 = highest; the scavenger class is the policy's last level
    messages: int
    nbytes: int

    def validate(self) -> None:
        bounded(self.level, "queue level", 0, MAX_LEVEL)
        bounded(self.messages, "queue messages", 0, MAX_COUNT)
        bounded(self.nbytes, "queue nbytes", 0, MAX_BYTES)


@dataclass(frozen=True)
class BatchRank:
    """One batch's place in the coordinator's RED order."""

    batch_id: str
    rank: int  # 0 = first
    red: float
    finish: float  # Algorithm 1's worst-case finish estimate, wall clock s
    nodes: tuple[str, ...]  # daemons that reported the batch


@dataclass(frozen=True)
class DaemonStatus:
    node: str
    alive: bool
    heartbeat_age: float  # s since the last message from it
    batches: int
    mode: str  # as the daemon last reported it
    ports: tuple[PortInfo, ...]
    queues: tuple[QueueDepth, ...]


@dataclass(frozen=True)
class BatchStatus:
    id: str
    nodes: tuple[str, ...]
    requests: int
    compute: float
    rank: int
    red: float
    finish: float


@dataclass(frozen=True)
class LatencySummary:
    """Decision latency (message in -> decision published), ms."""

    count: int
    last: float
    p50: float
    p99: float
    max: float


# ------------------------------------------------------------------ daemon -> coordinator


@message("hello")
@dataclass(frozen=True)
class Hello:
    """A daemon's full state: on start, on reconnect, and when asked (ResyncRequest).

    Replaces everything the coordinator held for ``node``."""

    node: str
    reason: str  # one of HELLO_REASONS
    ports: tuple[PortInfo, ...]
    batches: tuple[BatchInfo, ...]

    def validate(self) -> None:
        _ident(self.node, "node")
        if self.reason not in HELLO_REASONS:
            raise ValueError(f"reason {self.reason!r} (expected one of {', '.join(HELLO_REASONS)})")
        if len({b.id for b in self.batches}) != len(self.batches):
            raise ValueError("hello lists a batch twice")


@message("heartbeat")
@dataclass(frozen=True)
class Heartbeat:
    """Liveness and a summary, every heartbeat period (default 0.5 s)."""

    node: str
    seq: int  # per daemon process, +1 each beat
    batches: int  # active batches the daemon holds (the coordinator resyncs on a mismatch)
    mode: str  # one of DAEMON_MODES
    coordinator_id: str  # of the last Decision applied, "" if none
    applied_seq: int  # its seq, -1 if none
    queues: tuple[QueueDepth, ...]

    def validate(self) -> None:
        _ident(self.node, "node")
        bounded(self.seq, "seq", 0, INT64_MAX)
        bounded(self.batches, "batches", 0, MAX_COUNT)
        bounded(self.applied_seq, "applied_seq", -1, INT64_MAX)
        if self.mode not in DAEMON_MODES:
            raise ValueError(f"mode {self.mode!r} (expected one of {', '.join(DAEMON_MODES)})")


@message("batch_arrival")
@dataclass(frozen=True)
class BatchArrival:
    node: str
    batch: BatchInfo

    def validate(self) -> None:
        _ident(self.node, "node")


@message("batch_departure")
@dataclass(frozen=True)
class BatchDeparture:
    node: str
    batch_id: str

    def validate(self) -> None:
        _ident(self.node, "node")
        _ident(self.batch_id, "batch_id")


# ------------------------------------------------------------------ coordinator -> daemon


@message("welcome")
@dataclass(frozen=True)
class Welcome:
    """Answer to Hello: who the coordinator is and what it expects."""

    coordinator_id: str  # random per coordinator process
    heartbeat_s: float  # the period the coordinator expects
    dead_after_s: float  # silence after which it drops the daemon's batches


@message("resync_request")
@dataclass(frozen=True)
class ResyncRequest:
    coordinator_id: str
    reason: str  # human-readable: "unknown daemon", "batch count mismatch"


@message("decision")
@dataclass(frozen=True)
class Decision:
    """Algorithm 1's output for the whole cluster, on PUB.

    Daemons apply a decision when ``(coordinator_id, seq)`` is newer than the
    one they hold (a new coordinator_id resets the sequence)."""

    coordinator_id: str
    seq: int  # +1 per decision of this coordinator process
    now: float  # the instant Algorithm 1 ran at
    trigger: str  # "arrival <batch>", "departure <batch>", "hello <node>", "dead <node>", "republish"
    order: tuple[BatchRank, ...]  # ascending RED: rank breaks ties between levels' peers
    pruned: tuple[str, ...]  # request ids to serve in the scavenger class


# ------------------------------------------------------------------ status


@message("status_request")
@dataclass(frozen=True)
class StatusRequest:
    detail: bool  # include per-batch rows


@message("status_response")
@dataclass(frozen=True)
class StatusResponse:
    coordinator_id: str
    started: float
    now: float
    seq: int  # last decision's seq, -1 if none yet (``laxflow status --json`` shows null)
    daemons: tuple[DaemonStatus, ...]  # dead ones too (alive False) until the coordinator's forget-after
    batches: tuple[BatchStatus, ...]  # empty unless detail was asked
    active_batches: int
    active_requests: int
    pruned: tuple[str, ...]
    latency: LatencySummary
    dropped: dict[str, int]  # frames dropped by DropReason value
    # Added after the first release (a default: an older coordinator leaves them out).
    auth: str = ""  # one of AUTH_MODES; "" from a coordinator that does not say
    handshake_failures: dict[str, int] = field(default_factory=dict)  # peers refused at the ZeroMQ handshake, by kind

    def validate(self) -> None:
        if self.auth and self.auth not in AUTH_MODES:
            raise ValueError(f"auth {self.auth!r} (expected one of {', '.join(AUTH_MODES)})")
