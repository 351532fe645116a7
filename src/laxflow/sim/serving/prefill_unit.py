"""A prefill unit's queue and the local-scheduler interface that forms its batches.

The simulator calls :meth:`PrefillUnit.enqueue` when the router sends a
request here and :meth:`PrefillUnit.next_batch` whenever the unit is idle
(after an arrival, and when a batch's compute ends). Under DP attention a
unit has ``ranks`` attention-DP ranks, each with its own queue and its own
token budget (as SGLang's DP attention and vLLM's DP+EP engines batch); a
request joins the rank with the fewest queued new tokens (ties: lowest), and
the unit's step runs every rank's batch together, since the MoE all-to-alls
synchronize the ranks layer by layer. Which waiting requests go into a
rank's next batch is the local scheduler's decision: FCFS here; the
prefill-side policies of later issues (FlowPrefill, FairBatching, ProServe)
register under their own names and plug in without touching the simulator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Sequence

from laxflow.registry import Registry
from laxflow.sim.serving.request_state import RequestState


class LocalScheduler(ABC):
    """Forms one prefill batch from a unit's waiting requests.

    Called on the simulator's thread when the unit is idle and has waiting
    requests. Must return a non-empty list (a prefix of what it wants to run
    now) taken from ``waiting``; the unit removes them from its queue.
    """

    name: ClassVar[str] = ""

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget

    @abstractmethod
    def select(self, waiting: Sequence[RequestState], now: float) -> list[RequestState]:
        """The requests of the next batch, in batch order."""


class FcfsScheduler(LocalScheduler):
    """First come, first served, up to ``token_budget`` new tokens per batch.

    A request larger than the budget runs alone in its own batch (chunked
    prefill is not modelled); nothing is skipped over, as in vLLM's FCFS.
    """

    name = "fcfs"

    def select(self, waiting: Sequence[RequestState], now: float) -> list[RequestState]:
        batch: list[RequestState] = []
        tokens = 0
        for state in waiting:
            n = max(1, state.new_tokens)
            if batch and tokens + n > self.token_budget:
                break
            batch.append(state)
            tokens += n
        return batch


_LOCAL_SCHEDULERS: Registry[LocalScheduler] = Registry("local scheduler", LocalScheduler, {})
_LOCAL_SCHEDULERS.register("fcfs", FcfsScheduler)


def register_local_scheduler(name: str, target: str | type[LocalScheduler]) -> None:
    """Add a local scheduler under ``name`` (a class or a lazy ``module:Class``); names are unique."""
    _LOCAL_SCHEDULERS.register(name, target)


def local_scheduler_names() -> list[str]:
    return _LOCAL_SCHEDULERS.names()


def create_local_scheduler(name: str, token_budget: int) -> LocalScheduler:
    """A fresh local scheduler (one per prefill unit); raises ValueError naming the valid choices."""
    return _LOCAL_SCHEDULERS.get(name)(token_budget)


class PrefillUnit:
    """Per-rank queues and busy state of one prefill unit."""

    def __init__(self, index: int, scheduler: LocalScheduler, ranks: int = 1) -> None:
        self.index = index
        self.scheduler = scheduler
        self.rank_waiting: list[list[RequestState]] = [[] for _ in range(ranks)]
        self.rank_tokens = [0] * ranks  # new tokens waiting or running on each rank
        self.busy = False
        self.queued_tokens = 0  # new tokens waiting or running here (the router's load signal)

    @property
    def waiting(self) -> list[RequestState]:
        """Every rank's waiting requests, rank by rank."""
        return [s for q in self.rank_waiting for s in q]

    def enqueue(self, state: RequestState) -> None:
        """Queue ``state`` on the least loaded rank and record the rank on it."""
        rank = min(range(len(self.rank_tokens)), key=lambda r: (self.rank_tokens[r], r))
        state.rank = rank
        self.rank_waiting[rank].append(state)
        self.rank_tokens[rank] += state.new_tokens
        self.queued_tokens += state.new_tokens

    def next_batch(self, now: float) -> list[RequestState]:
        """Requests of the step to start now, every rank's batch (empty if busy or nothing waits)."""
        if self.busy:
            return []
        chosen: list[RequestState] = []
        for r, waiting in enumerate(self.rank_waiting):
            if not waiting:
                continue
            picked = self.scheduler.select(waiting, now)
            if picked:
                ids = set(map(id, picked))
                self.rank_waiting[r] = [s for s in waiting if id(s) not in ids]
                chosen.extend(picked)
        if chosen:
            self.busy = True
        return chosen

    def batch_done(self, states: Sequence[RequestState]) -> None:
        self.busy = False
        for s in states:
            self.rank_tokens[s.rank] -= s.new_tokens
            self.queued_tokens -= s.new_tokens
