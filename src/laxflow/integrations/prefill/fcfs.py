"""FCFS without preemption (DistServe's default prefill policy)."""

from __future__ import annotations

from laxflow.integrations.prefill.base import Action, Boundary, PrefillScheduler, Task


class Fcfs(PrefillScheduler):
    """Arrival order, batches up to the token budget; a larger request runs alone; never preempts."""

    name = "fcfs"
    granularity = Boundary.NEVER

    def _round(self, now: float) -> list[Action]:
        if self.running is not None or not self.waiting:
            return []
        chosen, tokens = [], 0
        for r in self.waiting:
            if chosen and tokens + int(r.new_tokens) > self.token_budget:
                break
            chosen.append(r)
            tokens += int(r.new_tokens)
        return self._switch_to(Task(tuple(chosen)), new=True)
