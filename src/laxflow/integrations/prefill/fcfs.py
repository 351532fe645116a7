"""FCFS without preemption (DistServe's default prefill policy), and its batch rule.

:func:`fcfs_batch` is the one FCFS rule of laxflow's prefill side: the
:class:`Fcfs` scheduler forms its tasks with it, and the serving simulator's
prefill units (``sim/serving/prefill_unit.py``) form each attention-DP
rank's batch with it.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from laxflow.integrations.prefill.base import Action, Boundary, PrefillScheduler, Task

R = TypeVar("R")


def fcfs_batch(waiting: Sequence[R], token_budget: int) -> list[R]:
    """The head of ``waiting`` (arrival order) up to ``token_budget`` new tokens (each request's
    ``new_tokens``); a request larger than the budget runs alone; nothing is skipped over, as in
    vLLM's FCFS. Empty only when ``waiting`` is."""
    chosen: list[R] = []
    tokens = 0
    for r in waiting:
        n = int(r.new_tokens)
        if chosen and tokens + n > token_budget:
            break
        chosen.append(r)
        tokens += n
    return chosen


class Fcfs(PrefillScheduler):
    """Arrival order, batches up to the token budget; a larger request runs alone; never preempts."""

    name = "fcfs"
    granularity = Boundary.NEVER

    def _round(self, now: float) -> list[Action]:
        if self.running is not None or not self.waiting:
            return []
        return self._switch_to(Task(tuple(fcfs_batch(self.waiting, self.token_budget))), new=True)
