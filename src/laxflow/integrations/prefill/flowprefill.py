"""FlowPrefill: S-EDF priority, SLO-aware batching, event-driven rounds (paper §5.2).

Called by an executor as described in ``base.py``; rounds run only on
arrival and completion (Algorithm 2), and a switch away from the running
task takes effect at its next operator boundary (§5.1).
"""

from __future__ import annotations

from typing import Any

from laxflow.integrations.prefill.base import Action, Boundary, PrefillScheduler, Task

_RUNNING, _SUSPENDED, _WAITING = 0, 1, 2  # tie-break: never switch for an equal priority


class FlowPrefill(PrefillScheduler):
    """S-EDF over waiting requests and suspended/running tasks; Algorithm 1 batches a new head."""

    name = "flowprefill"
    granularity = Boundary.OPERATOR

    def slack(self, deadline: float, tokens: int, progress: float, now: float) -> float:
        """deadline - now - predicted TTFT of what is left (eq. 3's slack)."""
        return deadline - now - self.predictor(tokens) * (1.0 - progress)

    def priority_key(self, deadline: float, tokens: int, progress: float, now: float) -> tuple[int, float]:
        """Sort key, smallest first, ordering like sgn(slack)/deadline descending.

        Non-negative slack first by earliest deadline, then negative slack by
        latest deadline -- what eq. 3 gives for positive deadlines, written so
        that any clock origin (the engine's monotonic clock) orders the same.
        """
        if self.slack(deadline, tokens, progress, now) >= 0:
            return (0, deadline)
        return (1, -deadline)

    def ranked(self, now: float) -> list[tuple[Any, Task | None]]:
        """Q_all in descending priority: (request, None) for waiting ones, (head, task) for tasks."""
        entries: list[tuple[tuple, Any, Task | None]] = []
        tasks = ([(self.running, _RUNNING)] if self.running is not None else []) + [
            (t, _SUSPENDED) for t in self.suspended
        ]
        for task, where in tasks:
            key = self.priority_key(task.head.deadline, task.tokens, task.progress, now)
            entries.append((key + (where, task.head.arrival), task.head, task))
        for seq, r in enumerate(self.waiting):
            key = self.priority_key(r.deadline, int(r.new_tokens), 0.0, now)
            entries.append((key + (_WAITING, r.arrival, seq), r, None))
        entries.sort(key=lambda e: e[0])
        return [(r, t) for _, r, t in entries]

    def batch(self, head: Any, candidates: list[Any], now: float) -> list[Any]:
        """Algorithm 1 (SLO-aware batching): add candidates in order while H still fits its deadline and G."""
        chosen = [head]
        t_remain = head.deadline - now
        n_tokens = int(head.new_tokens)
        for r in candidates:
            n = n_tokens + int(r.new_tokens)
            if t_remain > self.predictor(n) and n < self.token_budget:
                chosen.append(r)
                n_tokens = n
        return chosen

    def _round(self, now: float) -> list[Action]:
        order = self.ranked(now)
        if not order:
            return []
        head, task = order[0]
        if task is self.running and task is not None:
            return []
        if task is not None:
            return self._switch_to(task, new=False)
        # C = Q_w without H, in priority order (a running task cannot join a new batch)
        candidates = [r for r, t in order[1:] if t is None]
        return self._switch_to(Task(tuple(self.batch(head, candidates, now))), new=True)
