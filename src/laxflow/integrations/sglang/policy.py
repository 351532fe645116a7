"""laxflow's prefill policy as SGLang's ``SchedulePolicy`` (FlowPrefill S-EDF, SLO-aware admission, deferral).

SGLang's scheduler (its own process, one busy-loop thread) builds one
``SchedulePolicy`` in ``init_schedule_policy`` and, in every prefill step,
calls ``policy.calc_priority(waiting_queue, ...)`` to order the waiting queue
before it admits requests in that order until its budgets run out. With the
plugin's class replacement SGLang builds :class:`LaxflowSchedulePolicy`
instead, which lets SGLang order the queue first (``--schedule-policy``,
priority scheduling), then, inside a prefill step
(:func:`around_get_new_batch_prefill` marks it):

* requests the coordinator pruned (hooks ``pruned()``) leave the queue for
  the step and come back at its front afterwards, in their order;
* when some request has an SLO or a laxflow priority (``custom_params``
  ``ttft_slo_ms``, ``tpot_slo_ms``, ``priority``): the queue in (priority,
  S-EDF) order, requests without an SLO after those with one in SGLang's
  order; when the head has a TTFT deadline, FlowPrefill's Algorithm 1 picks
  the head's batch within ``max_prefill_tokens`` and the rest sit the step
  out (they keep their place).

With nothing pruned and no SLO or priority in the queue, the queue is exactly
SGLang's. Preemption of a running prefill is not attempted: SGLang runs a
prefill batch to its end. Lifecycle goes to the hooks: ``register_request``
on first sight, ``batch_formed`` per prefill batch, ``request_done`` when a
request's prefill is complete.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sglang.srt.managers.schedule_policy import SchedulePolicy

from laxflow.integrations.prefill.base import TtftPredictor
from laxflow.integrations.prefill.flowprefill import FlowPrefill
from laxflow.integrations.sglang.requests import TABLE, Tracked
from laxflow.integrations.sglang.settings import load_settings
from laxflow.integrations.vllm.hooks import HooksLink, connect

log = logging.getLogger("laxflow.sglang")

_ACTIVE: list["LaxflowSchedulePolicy"] = []  # the policy SGLang built in this process (one scheduler each)


@dataclass(eq=False)
class _View:
    """A waiting SGLang ``Req`` as FlowPrefill reads it."""

    req: Any
    entry: Tracked
    new_tokens: int
    index: int  # its place in SGLang's order

    @property
    def deadline(self) -> float:
        return self.entry.deadline

    @property
    def has_slo(self) -> bool:
        return self.entry.slo.ttft_s is not None or self.entry.slo.tpot_s is not None


def _new_tokens(req: Any) -> int:
    """Prompt tokens not yet in the cache (at least 1)."""
    return max(1, len(req.origin_input_ids) - int(getattr(req, "prefix_len", 0) or 0))


class LaxflowSchedulePolicy(SchedulePolicy):
    """SGLang's ``SchedulePolicy`` with laxflow's prefill policy on top; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.laxflow_settings = load_settings()
        self.laxflow_hooks = HooksLink(connect(self.laxflow_settings.hooks))
        self.laxflow_stats: Counter[str] = Counter()
        self.flowprefill = FlowPrefill(TtftPredictor(self.laxflow_settings.prefill_samples()))
        self._in_step = False
        self._held: list[Any] = []
        self._batches = 0
        _ACTIVE[:] = [self]

    # ------------------------------------------------------------- the step

    def begin_step(self, token_budget: int) -> None:
        """Called by :func:`around_get_new_batch_prefill` before SGLang forms a prefill batch."""
        self.flowprefill.token_budget = max(1, int(token_budget))
        self._in_step, self._held = True, []

    def end_step(self) -> list[Any]:
        """The requests that sat this step out, in order (the caller puts them back at the queue's front)."""
        held, self._held, self._in_step = self._held, [], False
        return held

    def calc_priority(self, waiting_queue: list[Any], running_batch: Any = None, processed_tokens: int = 0) -> None:
        super().calc_priority(waiting_queue, running_batch, processed_tokens=processed_tokens)
        if not self._in_step:
            return  # not forming a prefill batch (the decode side's queue): SGLang's order
        admitted, held = self.plan(list(waiting_queue), time.time())
        if held or admitted != waiting_queue:
            waiting_queue[:] = admitted
            self._held.extend(held)

    def plan(self, waiting: list[Any], now: float) -> tuple[list[Any], list[Any]]:
        """(the queue this step, the requests sitting it out) for ``waiting`` in SGLang's order."""
        entries = [self.track(r) for r in waiting]
        pruned = self._pruned()
        deferred = [r for r in waiting if r.rid in pruned]
        if deferred:
            self.laxflow_stats["pruned_deferrals"] += len(deferred)
        views = [_View(r, e, _new_tokens(r), i) for i, (r, e) in enumerate(zip(waiting, entries)) if r.rid not in pruned]
        if not any(v.entry.slo.given for v in views):
            return [v.req for v in views], deferred
        ranked = sorted(views, key=lambda v: self._key(v, now))
        head = ranked[0]
        if not (head.has_slo and math.isfinite(head.deadline)):
            return [v.req for v in ranked], deferred
        chosen = {id(v) for v in self.flowprefill.batch(head, ranked[1:], now)}
        held = [v.req for v in ranked if id(v) not in chosen]
        self.laxflow_stats["admission_holds"] += len(held)
        return [v.req for v in ranked if id(v) in chosen], deferred + held

    def _key(self, v: _View, now: float) -> tuple:
        priority = v.entry.slo.priority
        if not v.has_slo or not math.isfinite(v.deadline):
            return (priority, 1, 0, 0.0, v.index)
        return (priority, 0) + self.flowprefill.priority_key(v.deadline, v.new_tokens, 0.0, now) + (v.index,)

    # ------------------------------------------------------------ lifecycle

    def track(self, req: Any) -> Tracked:
        """The request's entry; on first sight ``register_request`` goes to the hooks."""
        entry, new = TABLE.track(req)
        if new:
            if entry.slo.error:
                self.laxflow_stats["bad_custom_params"] += 1
                log.warning("laxflow: request %s: %s (ignored)", req.rid, entry.slo.error)
            deadline = entry.deadline
            self.laxflow_hooks.call("register_request", req.rid, deadline if math.isfinite(deadline) else None,
                                    len(req.origin_input_ids), len(req.origin_input_ids) - _new_tokens(req),
                                    entry.slo.priority)
        return entry

    def batch_formed(self, batch: Any) -> None:
        """Called after SGLang formed prefill batch ``batch`` (a ``ScheduleBatch``, or None)."""
        reqs = list(getattr(batch, "reqs", None) or ())
        if reqs:
            self._batches += 1
            self.laxflow_hooks.call("batch_formed", f"sglang-{self._batches}", [r.rid for r in reqs])

    def prefill_done(self, reqs: list[Any]) -> None:
        """Called after a prefill batch's result: ``request_done`` for each request that has its first token."""
        for req in reqs:
            if (len(req.output_ids) > 0 or req.finished()) and TABLE.get(req.rid) is not None:
                self.laxflow_hooks.call("request_done", req.rid)

    def _pruned(self) -> set[str]:
        if self.laxflow_hooks.hooks is None:
            return set()
        return set(self.laxflow_hooks.call("pruned") or ())


def active_policy() -> LaxflowSchedulePolicy | None:
    """The :class:`LaxflowSchedulePolicy` SGLang built in this process, if any."""
    return _ACTIVE[0] if _ACTIVE else None


# ------------------------------------------------------- the plugin's hooks

def around_get_new_batch_prefill(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``Scheduler.get_new_batch_prefill`` (SGLang's scheduler thread, once per step).

    Marks the step for the policy, puts the requests that sat it out back at
    the front of the queue, reports the batch, and records every batched
    request (with its bootstrap room) for the gated Mooncake backend.
    """
    policy = scheduler.policy if isinstance(getattr(scheduler, "policy", None), LaxflowSchedulePolicy) else None
    if policy is None:
        plan = original(scheduler, *args, **kwargs)
    else:
        policy.begin_step(getattr(scheduler, "max_prefill_tokens", policy.flowprefill.token_budget))
        try:
            plan = original(scheduler, *args, **kwargs)
        finally:
            held = policy.end_step()
            if held:
                ids = {id(r) for r in held}
                scheduler.waiting_queue = held + [r for r in scheduler.waiting_queue if id(r) not in ids]
    batch = getattr(plan, "batch_to_run", None)
    for req in getattr(batch, "reqs", None) or ():
        TABLE.track(req)
    if policy is not None:
        policy.batch_formed(batch)
    return plan


def after_prefill_result(result: Any, processor: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook on SGLang's prefill result processing (plain and disaggregated): ``request_done``."""
    policy = active_policy()
    if policy is not None and batch is not None:
        policy.prefill_done(list(getattr(batch, "reqs", None) or ()))
    return result
