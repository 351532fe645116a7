"""A prefill unit's queues and its run-to-end FCFS batches (the unit engine without ``--prefill``).

The simulator calls :meth:`PrefillUnit.enqueue` when the router sends a
request here and :meth:`PrefillUnit.next_batch` whenever the unit is idle
(after an arrival, and when a batch's compute ends). Under DP attention a
unit has ``ranks`` attention-DP ranks, each with its own queue and its own
token budget (as SGLang's DP attention and vLLM's DP+EP engines batch); a
request joins the rank with the fewest queued new tokens (ties: lowest), and
the unit's step runs every rank's batch together, since the MoE all-to-alls
synchronize the ranks layer by layer. Each rank's batch is
:func:`laxflow.integrations.prefill.fcfs.fcfs_batch`, the rule the ``fcfs``
prefill scheduler forms its tasks with; the other prefill schedulers
(FlowPrefill, EDF, ...) drive a unit through ``--prefill``
(:mod:`.prefill_driver`).
"""

from __future__ import annotations

from typing import Sequence

from laxflow.integrations.prefill.fcfs import fcfs_batch
from laxflow.sim.serving.request_state import RequestState


class PrefillUnit:
    """Per-rank queues and busy state of one prefill unit."""

    def __init__(self, index: int, token_budget: int, ranks: int = 1) -> None:
        self.index = index
        self.token_budget = token_budget  # new tokens per rank's batch
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

    def next_batch(self) -> list[RequestState]:
        """Requests of the step to start now, every rank's batch (empty if busy or nothing waits)."""
        if self.busy:
            return []
        chosen: list[RequestState] = []
        for r, waiting in enumerate(self.rank_waiting):
            picked = fcfs_batch(waiting, self.token_budget)  # a prefix of the rank's queue
            self.rank_waiting[r] = waiting[len(picked):]
            chosen.extend(picked)
        if chosen:
            self.busy = True
        return chosen

    def batch_done(self, states: Sequence[RequestState]) -> None:
        self.busy = False
        for s in states:
            self.rank_tokens[s.rank] -= s.new_tokens
            self.queued_tokens -= s.new_tokens
