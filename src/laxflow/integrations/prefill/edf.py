"""EDF baselines: chunked prefill (DistServe-CP2K / CP8K) and layer-level preemption.

Earliest deadline first over waiting requests and suspended/running tasks
(a task counts by its head's deadline). A new batch is the head plus the
next requests in EDF order while the batch stays within the token budget.
The running task is switched away from only at its next chunk boundary
(``edf-cp2k``, ``edf-cp8k``: the executor runs the prefill in chunks of
``chunk_tokens``) or layer boundary (``edf-layer``).
"""

from __future__ import annotations

from typing import Any

from laxflow.integrations.prefill.base import Action, Boundary, PrefillScheduler, Task


class EdfScheduler(PrefillScheduler):
    """Shared EDF logic; subclasses fix the preemption granularity."""

    def _round(self, now: float) -> list[Action]:
        best: tuple[tuple, Any, Task | None] | None = None
        tasks = ([(self.running, 0)] if self.running is not None else []) + [(t, 1) for t in self.suspended]
        for task, where in tasks:
            key = (task.head.deadline, where, task.head.arrival)
            if best is None or key < best[0]:
                best = (key, task.head, task)
        ordered = sorted(enumerate(self.waiting), key=lambda e: (e[1].deadline, e[1].arrival, e[0]))
        if ordered:
            seq, r = ordered[0]
            key = (r.deadline, 2, r.arrival, seq)
            if best is None or key < best[0]:
                best = (key, r, None)
        if best is None:
            return []
        _, head, task = best
        if task is not None:
            return [] if task is self.running else self._switch_to(task, new=False)
        chosen, tokens = [head], int(head.new_tokens)
        for _, r in ordered[1:]:
            if tokens + int(r.new_tokens) > self.token_budget:
                break
            chosen.append(r)
            tokens += int(r.new_tokens)
        return self._switch_to(Task(tuple(chosen)), new=True)


class EdfChunked2k(EdfScheduler):
    name = "edf-cp2k"
    granularity = Boundary.CHUNK
    chunk_tokens = 2048


class EdfChunked8k(EdfScheduler):
    name = "edf-cp8k"
    granularity = Boundary.CHUNK
    chunk_tokens = 8192


class EdfLayer(EdfScheduler):
    name = "edf-layer"
    granularity = Boundary.LAYER
