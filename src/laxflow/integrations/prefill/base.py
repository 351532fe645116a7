"""The prefill-scheduler interface: events in, actions out (FlowPrefill §4-§5.2).

A prefill scheduler is pure: it never sleeps, reads a clock or touches a
device. Whoever executes prefills -- the serving simulator's prefill unit or
the real engine's execution pool (``laxflow.integrations.engine``) -- owns the
clock and drives it with the same objects, on one thread, one event at a time:

1. When a request reaches this prefill instance, call
   ``actions = scheduler.arrival(request, now)``.
2. When a task has computed its last operator, call
   ``actions = scheduler.completion(task, now)``.
3. Apply the returned actions IN ORDER:

   - ``Preempt(task)``: raise the task's preemption signal. The task keeps
     running until the next boundary ``b`` it reaches with
     ``yields_at(b, scheduler.granularity)``; there it suspends (its state --
     layer, operator and activations -- is kept) and the executor calls
     ``scheduler.preempted(task, b, progress, now)``, the acknowledgement of
     FlowPrefill's Figure 7. If the task computes its last operator first,
     report ``completion`` instead; no suspension happens.
   - ``Submit(task)``: start a new task (a batch of requests, first one the
     head). It starts only after every ``Preempt`` listed before it in the
     same action list was acknowledged (or its task completed): at most one
     task runs at a time.
   - ``Resume(task)``: continue a suspended task where it stopped; same
     ordering rule as ``Submit``.

   A ``Preempt`` may name a task that was submitted or resumed but has not
   started yet: it then simply stays suspended (progress unchanged).

4. At every boundary a running task passes the executor asks
   ``yields_at(kind, scheduler.granularity)`` only when a signal is raised,
   so the checks cost a flag test. ``Boundary`` orders the kinds: a chunk
   boundary is also a layer boundary, a layer boundary also an operator one;
   pass the coarsest kind that applies.

Requests are any objects with ``id``, ``arrival``, ``deadline`` (absolute,
same clock as ``now``) and ``new_tokens`` (tokens this prefill computes): the
simulator's ``RequestState`` qualifies as is; ``PrefillRequest`` is the plain
dataclass the engine and the tests use.
"""

from __future__ import annotations

import enum
import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np


class Boundary(enum.IntEnum):
    """Where a running prefill can stop, finest first; ``NEVER`` = run to completion."""

    OPERATOR = 0  # between qkv_proj, attn, o_proj, gate_up_proj, down_proj
    LAYER = 1  # after a transformer layer's down_proj
    CHUNK = 2  # after a chunk of a chunked prefill
    NEVER = 3  # not a boundary: a scheduler with this granularity never preempts


def yields_at(kind: Boundary, granularity: Boundary) -> bool:
    """Whether a task whose preemption signal is raised suspends at a ``kind`` boundary."""
    return granularity != Boundary.NEVER and kind >= granularity


@runtime_checkable
class Request(Protocol):
    """What a scheduler reads of a request (the simulator's RequestState has it all)."""

    @property
    def id(self) -> str: ...

    @property
    def arrival(self) -> float: ...

    @property
    def deadline(self) -> float: ...

    @property
    def new_tokens(self) -> int: ...


@dataclass(eq=False)
class PrefillRequest:
    """A request as the engine and the tests build it; ``deadline`` = arrival + TTFT SLO."""

    id: str
    arrival: float
    deadline: float
    new_tokens: int
    payload: Any = None  # what the executor needs to compute it (token ids in the engine)

    def __post_init__(self) -> None:
        if self.new_tokens < 1:
            raise ValueError(f"request {self.id}: new_tokens must be >= 1, got {self.new_tokens}")
        if not (math.isfinite(self.arrival) and math.isfinite(self.deadline)):
            raise ValueError(f"request {self.id}: arrival and deadline must be finite")


_task_ids = itertools.count()


@dataclass(eq=False)
class Task:
    """One execution: a batch of requests run as one prefill (FlowPrefill's execution task).

    ``progress`` (0..1) is the executor's last report of how much of the task
    is computed; the scheduler uses it to predict the time a suspended task
    still needs.
    """

    requests: tuple[Any, ...]
    id: int = field(default_factory=lambda: next(_task_ids))
    progress: float = 0.0

    @property
    def head(self) -> Any:
        return self.requests[0]

    @property
    def tokens(self) -> int:
        return sum(int(r.new_tokens) for r in self.requests)

    def __repr__(self) -> str:
        return f"Task({self.id}, {[r.id for r in self.requests]})"


@dataclass(frozen=True)
class Submit:
    task: Task


@dataclass(frozen=True)
class Preempt:
    task: Task


@dataclass(frozen=True)
class Resume:
    task: Task


Action = Submit | Preempt | Resume


class TtftPredictor:
    """Prefill time as a polynomial in batch tokens, fitted to a compute profile (§6.4).

    Built once per model and hardware from ``(tokens, seconds)`` samples: the
    simulator profiles its compute model, the engine times its own forward.
    """

    def __init__(self, samples: Sequence[tuple[float, float]], degree: int = 2) -> None:
        if degree < 1:
            raise ValueError(f"degree must be >= 1, got {degree}")
        pts = np.asarray(samples, dtype=float)
        if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < degree + 1:
            raise ValueError(f"need at least {degree + 1} (tokens, seconds) samples for degree {degree}")
        if not np.all(np.isfinite(pts)) or np.any(pts[:, 0] <= 0) or np.any(pts[:, 1] < 0):
            raise ValueError("samples must be finite, tokens > 0 and seconds >= 0")
        self.degree = degree
        self.coefficients = np.polyfit(pts[:, 0], pts[:, 1], degree)

    @classmethod
    def from_function(cls, seconds_of, max_tokens: int, points: int = 16, degree: int = 2) -> "TtftPredictor":
        """Fit to ``seconds_of(tokens)`` sampled on ``points`` sizes up to ``max_tokens``."""
        sizes = np.unique(np.linspace(1, max_tokens, points).round().astype(int))
        return cls([(int(n), float(seconds_of(int(n)))) for n in sizes], degree)

    def __call__(self, tokens: float) -> float:
        """Predicted seconds to prefill ``tokens`` tokens (never negative)."""
        return max(0.0, float(np.polyval(self.coefficients, tokens)))


class PrefillScheduler(ABC):
    """Decides which batch of requests the prefill instance computes, and when to switch.

    Called on the executor's scheduling thread (the simulator's event loop, or
    the engine's scheduler thread) only on the events listed in the module
    docstring; it keeps the request queue state and returns actions.
    """

    name: ClassVar[str] = ""
    granularity: ClassVar[Boundary] = Boundary.NEVER
    chunk_tokens: ClassVar[int | None] = None  # chunked prefill: tokens per chunk the executor runs
    # Forms a task over attention-DP ranks: one batch per rank (a request's ``rank``, given by the
    # executor on arrival), the ranks' batches run as one step. False: the instance must have one rank.
    rank_batches: ClassVar[bool] = False

    def __init__(self, predictor: TtftPredictor, token_budget: int = 8192) -> None:
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
        self.predictor = predictor
        self.token_budget = token_budget
        self.waiting: list[Any] = []  # Q_w: requests not yet in a task
        self.suspended: list[Task] = []  # Q_p: preempted tasks
        self.running: Task | None = None  # E: the task the executor runs (or will, once preemptions ack)
        self.preemptions: list[tuple[Task, Boundary]] = []  # acknowledged preemptions, in order
        # Started tasks the network gave up on (``defer``): out of Q_p/E, resumed only when idle.
        self.deferred: list[Task] = []
        self.deferrals = 0  # tasks moved to ``deferred``, ever

    def arrival(self, request: Any, now: float) -> list[Action]:
        """A request reached this instance: queue it and run a scheduling round."""
        return self.arrivals([request], now)

    def arrivals(self, requests: Sequence[Any], now: float) -> list[Action]:
        """Requests that reached this instance at the same instant, in arrival order: queue them all,
        then run one scheduling round (an engine's scheduler loop sees them together)."""
        self.waiting.extend(requests)
        return self._round(now)

    def completion(self, task: Task, now: float) -> list[Action]:
        """``task`` computed its last operator: drop it and run a scheduling round."""
        if self.running is task:
            self.running = None
        elif task in self.suspended:  # finished before reaching a boundary where it could yield
            self.suspended.remove(task)
        elif task in self.deferred:  # deferred while running, finished before it could yield
            self.deferred.remove(task)
        else:
            raise ValueError(f"completion of unknown task {task!r}")
        task.progress = 1.0
        return self._undefer_if_idle(self._round(now), now)

    def defer(self, pruned: set[str], now: float) -> list[Action]:
        """Network and compute together: started tasks whose requests are ALL in ``pruned`` stop computing.

        ``pruned`` holds request ids (``str(request.id)``) the network scheduler
        (MFS, via the hooks' ``pruned()``) found cannot meet their deadline. A
        suspended one leaves Q_p; the running one is preempted (if this
        scheduler can preempt at all) and left out of E -- only while other
        work is there to take the compute (a lone doomed task keeps going). Both wait in
        ``deferred`` and come back, oldest first, only when nothing else waits,
        runs or is suspended, so their compute goes to requests that can still
        make it. Requests still in Q_w are never pruned (the network has not
        seen their flows). Called by the engine's scheduler thread on every
        event; the actions follow the usual ordering rules.
        """
        actions: list[Action] = []
        if not pruned:
            return actions
        doomed = lambda t: all(str(r.id) in pruned for r in t.requests)  # noqa: E731
        if not (self.waiting or any(not doomed(t) for t in self.suspended)
                or (self.running is not None and not doomed(self.running))):
            return self._undefer_if_idle(actions, now)  # nothing else could use the compute: keep going
        moved = [t for t in self.suspended if doomed(t)]
        for task in moved:
            self.suspended.remove(task)
            self.deferred.append(task)
        run = self.running
        if run is not None and doomed(run) and self.granularity != Boundary.NEVER:
            actions.append(Preempt(run))
            self.running = None
            self.deferred.append(run)
            moved.append(run)
        self.deferrals += len(moved)
        if moved:
            actions += self._round(now)
        return self._undefer_if_idle(actions, now)

    def _undefer_if_idle(self, actions: list[Action], now: float) -> list[Action]:
        if self.deferred and self.idle():
            self.suspended.append(self.deferred.pop(0))
            actions = actions + self._round(now)
        return actions

    def preempted(self, task: Task, kind: Boundary, progress: float, now: float) -> None:
        """The executor suspended ``task`` at a ``kind`` boundary with ``progress`` done (the ack)."""
        task.progress = progress
        self.preemptions.append((task, kind))

    def idle(self) -> bool:
        """Nothing waits, runs or is suspended (tests end with this leak check)."""
        return not self.waiting and not self.suspended and self.running is None

    @abstractmethod
    def _round(self, now: float) -> list[Action]:
        """One scheduling round over the current state."""

    def _switch_to(self, task: Task, new: bool) -> list[Action]:
        """Actions that make ``task`` the running one (preempting the current one first)."""
        actions: list[Action] = []
        if self.running is not None:
            actions.append(Preempt(self.running))
            self.suspended.append(self.running)
        if new:
            picked = set(map(id, task.requests))
            self.waiting = [r for r in self.waiting if id(r) not in picked]
            actions.append(Submit(task))
        else:
            self.suspended.remove(task)
            actions.append(Resume(task))
        self.running = task
        return actions
