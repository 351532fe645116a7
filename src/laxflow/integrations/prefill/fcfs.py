"""FCFS without preemption (DistServe's default prefill policy), and its batch rule.

:func:`fcfs_batch` is the one FCFS rule of laxflow's prefill side: the
:class:`Fcfs` scheduler forms each attention-DP rank's batch of its tasks
with it. :class:`Fcfs` is the serving simulator's default prefill scheduler
(its prefill units without ``--prefill``) and ``bench/capacity.py``'s.
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
    """Arrival order, batches up to the token budget; a larger request runs alone; never preempts.

    Under DP attention each rank (a request's ``rank``, 0 when it has none)
    batches its own requests up to the budget, and the task is every rank's
    batch, rank by rank: the ranks step together (the MoE all-to-alls
    synchronize them layer by layer).
    """

    name = "fcfs"
    granularity = Boundary.NEVER
    rank_batches = True

    def _round(self, now: float) -> list[Action]:
        if self.running is not None or not self.waiting:
            return []
        by_rank: dict[int, list] = {}
        for r in self.waiting:
            by_rank.setdefault(int(getattr(r, "rank", 0)), []).append(r)
        chosen = [r for k in sorted(by_rank) for r in fcfs_batch(by_rank[k], self.token_budget)]
        return self._switch_to(Task(tuple(chosen)), new=True)
