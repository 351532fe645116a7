"""Records the daemon core keeps and hands out (plain data, no behavior).

Created and mutated only by :class:`~laxflow.daemon.core.DaemonCore` on the
daemon's loop thread; :class:`PermitChange`, :class:`BatchReport` and
:class:`StepResult` are what :meth:`DaemonCore.step` returns to the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laxflow.policy.flow import Flow


@dataclass
class RequestInfo:
    """One serving request the node has seen (from hooks or from shim events)."""

    name: str
    batch: str
    deadline: float | None = None  # absolute TTFT deadline, s (daemon clock)
    prompt_tokens: int = 0
    reused_tokens: int = 0
    priority: int = 0
    done: bool = False


@dataclass
class BatchInfo:
    """One prefill batch with traffic on this node."""

    name: str
    arrived: float
    last_seen: float
    requests: set[str] = field(default_factory=set)
    current_layer: int | None = None
    compute_done: bool = False
    compute: float = 0.0  # estimated remaining compute, s (hooks)
    live: int = 0  # live messages on this node
    finished: bool = False  # every request done
    reported: bool = False  # its arrival went to the coordinator
    announced: bool = False  # formed through the hooks: the engine says when it ends (request_done)
    traffic: dict[str, dict[str, float]] = field(default_factory=dict)  # port -> request -> bytes the engine declared
    submitted: dict[str, dict[str, float]] = field(default_factory=dict)  # port -> request -> bytes of messages seen

    def expected_traffic(self) -> dict[str, dict[str, float]]:
        """Bytes per port and request for the coordinator: what the engine declared at ``batch_formed``,
        or what its messages already carry where that is more (an estimate, then the facts; never both
        added, which would count a declared transfer twice once its message is submitted)."""
        out = {port: dict(row) for port, row in self.traffic.items()}
        for port, row in self.submitted.items():
            mine = out.setdefault(port, {})
            for request, nbytes in row.items():
                if nbytes > mine.get(request, 0.0):
                    mine[request] = nbytes
        return out


@dataclass
class Message:
    """One live message (a layer's transfer or one collective) on one port."""

    msg_id: int
    port: int
    request: str
    batch: str
    size: float
    submitted: float
    pid: int
    flow: Flow
    done: float = 0.0  # bytes accounted done by progress reports
    granted: float | None = None  # when its permit was written
    spare: bool = False  # granted into the port's spare capacity (PermitChange.spare)
    level: int = 0  # RMLQ level (K = scavenger) it waits or went at
    dscp: int = 0
    rank: int = 0  # host order (policy's Decision.level)
    queue: int = 0  # RMLQ level the last decision gave it (= level until granted)


@dataclass(frozen=True)
class PermitChange:
    """A permit to write: gate, RMLQ level and DSCP of one message."""

    msg_id: int
    gate: int
    level: int
    dscp: int
    port: int
    waited: float  # s from submit to this permit
    spare: bool = False  # granted into the port's spare capacity, with higher ranks unfinished


@dataclass(frozen=True)
class BatchReport:
    """What the coordinator hears on a batch's arrival and departure (never per layer)."""

    kind: str  # "arrival" | "departure"
    batch: str
    at: float
    deadlines: dict[str, float | None]  # request -> absolute deadline
    compute: float  # estimated compute, s
    traffic: dict[str, dict[str, float]]  # port -> request -> bytes


@dataclass
class StepResult:
    permits: list[PermitChange]
    cleared: list[int]  # msg ids whose permit slot can be cleared
    reports: list[BatchReport]
    next_timer: float | None  # when the policy wants to be asked again
    decided: bool
