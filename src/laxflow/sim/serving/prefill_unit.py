"""A prefill unit's queue and the local-scheduler interface that forms its batches.

The simulator calls :meth:`PrefillUnit.enqueue` when the router sends a
request here and :meth:`PrefillUnit.next_batch` whenever the unit is idle
(after an arrival, and when a batch's compute ends). Which waiting requests
go into the next batch is the local scheduler's decision: FCFS here; the
prefill-side policies of later issues (FlowPrefill, FairBatching, ProServe)
register under their own names and plug in without touching the simulator.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import ClassVar, Sequence

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


_LOCAL_SCHEDULERS: dict[str, str | type[LocalScheduler]] = {"fcfs": FcfsScheduler}


def register_local_scheduler(name: str, target: str | type[LocalScheduler]) -> None:
    """Add a local scheduler under ``name`` (a class or a lazy ``module:Class``); names are unique."""
    if name in _LOCAL_SCHEDULERS:
        raise ValueError(f"local scheduler {name!r} is already registered")
    _LOCAL_SCHEDULERS[name] = target


def local_scheduler_names() -> list[str]:
    return sorted(_LOCAL_SCHEDULERS)


def create_local_scheduler(name: str, token_budget: int) -> LocalScheduler:
    target = _LOCAL_SCHEDULERS[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
        _LOCAL_SCHEDULERS[name] = target
    return target(token_budget)


class PrefillUnit:
    """Queue and busy state of one prefill unit."""

    def __init__(self, index: int, scheduler: LocalScheduler) -> None:
        self.index = index
        self.scheduler = scheduler
        self.waiting: list[RequestState] = []
        self.busy = False
        self.queued_tokens = 0  # new tokens waiting or running here (the router's load signal)

    def enqueue(self, state: RequestState) -> None:
        self.waiting.append(state)
        self.queued_tokens += state.new_tokens

    def next_batch(self, now: float) -> list[RequestState]:
        """Requests of the batch to start now (empty if busy or nothing waits)."""
        if self.busy or not self.waiting:
            return []
        chosen = self.scheduler.select(self.waiting, now)
        if not chosen:
            return []
        picked = set(map(id, chosen))
        self.waiting = [s for s in self.waiting if id(s) not in picked]
        self.busy = True
        return chosen

    def batch_done(self, states: Sequence[RequestState]) -> None:
        self.busy = False
        self.queued_tokens -= sum(s.new_tokens for s in states)
