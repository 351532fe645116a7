"""vLLM v1 scheduler classes driven by laxflow's prefill policies (``--scheduler-cls``).

vLLM's EngineCore builds one of these in the engine-core process and calls
``schedule()`` / ``update_from_output()`` on its busy-loop thread, once per
step. Each class keeps vLLM's own admission, KV allocation, chunking and
preemption logic and only changes, before each ``schedule()``:

* the order of the waiting queue (laxflow's policy order),
* which waiting requests may be admitted this step and the step's token
  budget (the policy's batch), and
* which running prefills sit out this step (a more urgent request preempts
  them). Preemption therefore happens at vLLM step boundaries only: a step,
  once scheduled, runs to its end. Operator-level preemption (FlowPrefill
  §5.1) needs laxflow's own execution engine, not vLLM.

Requests the coordinator pruned (``laxflow.hooks`` ``pruned()``) wait while
pruned. With no SLO, no priority and nothing pruned, ``schedule()`` is
exactly vLLM's.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler

from laxflow.integrations.vllm.hooks import HooksLink, connect
from laxflow.integrations.vllm.settings import RequestSlo, load_settings, request_slo

log = logging.getLogger("laxflow.vllm")


@dataclass(eq=False)
class _View:
    """A waiting or running vLLM request as FlowPrefill's ``Request`` protocol reads it."""

    id: str
    arrival: float
    deadline: float
    new_tokens: int
    priority: int
    has_slo: bool
    request: Any


@dataclass
class _Plan:
    """What one step changes: waiting requests held back, running ones sitting out, the token budget."""

    hold_waiting: list[Any]
    hold_running: list[Any]
    order: list[Any] | None = None
    budget: int | None = None


class _LaxflowScheduler(Scheduler):
    """Shared machinery: SLOs, hooks, pruning, and applying a :class:`_Plan` around vLLM's ``schedule()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.laxflow_settings = load_settings()
        self.laxflow_hooks = HooksLink(connect(self.laxflow_settings.hooks))
        self.laxflow_stats: Counter[str] = Counter()
        self._slo: dict[str, RequestSlo] = {}
        self._first_token_pending: set[str] = set()
        self._pruned: set[str] = set()

    # -------------------------------------------------------------- requests

    def slo_of(self, request: Any) -> RequestSlo:
        slo = self._slo.get(request.request_id)
        if slo is None:
            params = request.sampling_params
            slo = request_slo(params.extra_args if params is not None else None)
            if slo.error:
                self.laxflow_stats["bad_extra_args"] += 1
                log.warning("laxflow: request %s: %s (ignored)", request.request_id, slo.error)
            self._slo[request.request_id] = slo
        return slo

    def deadline_of(self, request: Any) -> float:
        slo = self.slo_of(request)
        return request.arrival_time + slo.ttft_s if slo.ttft_s is not None else math.inf

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        slo = self.slo_of(request)
        deadline = self.deadline_of(request)
        self._first_token_pending.add(request.request_id)
        self.laxflow_hooks.call("register_request", request.request_id, deadline if math.isfinite(deadline) else None,
                                request.num_prompt_tokens, request.num_computed_tokens, slo.priority)

    def _view(self, request: Any) -> _View:
        slo = self.slo_of(request)
        return _View(request.request_id, request.arrival_time, self.deadline_of(request),
                     max(1, request.num_tokens - request.num_computed_tokens), slo.priority,
                     slo.ttft_s is not None or slo.tpot_s is not None, request)

    # -------------------------------------------------------------- the step

    def plan(self, waiting: list[Any], now: float) -> _Plan | None:
        """The policy's decision for this step (None: vLLM decides alone). Subclasses override."""
        return None

    def schedule(self, throttle_prefills: bool = False):
        now = time.time()
        pruned = self.laxflow_hooks.call("pruned") if self.laxflow_hooks.hooks is not None else None
        self._pruned = set(pruned or ())
        waiting = list(self.waiting)
        deferred = [r for r in waiting if r.request_id in self._pruned]
        if deferred:
            self.laxflow_stats["pruned_deferrals"] += len(deferred)
            waiting = [r for r in waiting if r.request_id not in self._pruned]
        plan = self.plan(waiting, now) if waiting or self.running else None
        if plan is None and not deferred:
            return super().schedule(throttle_prefills)
        plan = plan or _Plan([], [])
        hold_waiting = deferred + [r for r in plan.hold_waiting if r not in deferred]
        return self._run_plan(plan, hold_waiting, throttle_prefills)

    def _run_plan(self, plan: _Plan, hold_waiting: list[Any], throttle_prefills: bool):
        if plan.order is not None and isinstance(self.waiting, FCFSRequestQueue):
            self.waiting.clear()
            self.waiting.extend(plan.order)
        elif plan.order is not None:
            self.laxflow_stats["order_unapplied"] += 1  # --scheduling-policy priority keeps vLLM's heap order
        held_ids = {id(r) for r in hold_waiting}
        self.waiting.remove_requests([r for r in self.waiting if id(r) in held_ids])
        original_running = list(self.running)
        sitting_out = {id(r) for r in plan.hold_running}
        self.running = [r for r in self.running if id(r) not in sitting_out]
        saved_budget = self.max_num_scheduled_tokens
        if plan.budget is not None:
            self.max_num_scheduled_tokens = max(1, min(saved_budget, plan.budget))
            self.laxflow_stats["budgeted_steps"] += 1
        self.laxflow_stats["step_preemptions"] += len(plan.hold_running)
        try:
            out = super().schedule(throttle_prefills)
        finally:
            self.max_num_scheduled_tokens = saved_budget
            now_running = {id(r) for r in self.running}
            restored = [r for r in original_running if id(r) in sitting_out or id(r) in now_running]
            restored_ids = {id(r) for r in restored}
            self.running = restored + [r for r in self.running if id(r) not in restored_ids]
            if hold_waiting:  # back at the front, in their order: they wait, they do not lose their place
                self.waiting.prepend_requests(list(reversed(hold_waiting)))  # deque extendleft reverses
        self._report_batch(out)
        return out

    def _report_batch(self, out: Any) -> None:
        new = [r.req_id for r in out.scheduled_new_reqs]
        if new:
            self.laxflow_hooks.call("batch_formed", f"step-{self.current_step}", new)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any):
        result = super().update_from_output(scheduler_output, model_runner_output)
        for rid in list(self._first_token_pending):
            req = self.requests.get(rid)
            if req is None or req.num_output_tokens > 0:
                self._first_token_pending.discard(rid)
                self.laxflow_hooks.call("request_done", rid)
        for rid in [r for r in self._slo if r not in self.requests]:
            del self._slo[rid]
        return result


class FlowPrefillScheduler(_LaxflowScheduler):
    """S-EDF order and SLO-aware batching (FlowPrefill, ``laxflow.integrations.prefill.flowprefill``).

    Per step: waiting requests in (priority, S-EDF) order, requests without
    an SLO after those with one (FCFS among themselves); the head's batch is
    Algorithm 1 over the rest within vLLM's token budget; other waiting
    requests wait this step; running prefills ranked below the head sit the
    step out (step-boundary preemption).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from laxflow.integrations.prefill.base import TtftPredictor
        from laxflow.integrations.prefill.flowprefill import FlowPrefill

        self.policy = FlowPrefill(TtftPredictor(self.laxflow_settings.prefill_samples()),
                                  token_budget=self.max_num_scheduled_tokens)

    def _key(self, v: _View, now: float, progress: float = 0.0) -> tuple:
        if not v.has_slo or not math.isfinite(v.deadline):
            return (v.priority, 1, 0, 0.0, v.arrival)
        return (v.priority, 0) + self.policy.priority_key(v.deadline, v.new_tokens, progress, now) + (v.arrival,)

    def plan(self, waiting: list[Any], now: float) -> _Plan | None:
        views = [self._view(r) for r in waiting]
        if not any(v.has_slo or v.priority != 0 for v in views):
            return None  # nothing laxflow knows about: vLLM's own order and budget
        ranked = sorted(enumerate(views), key=lambda iv: self._key(iv[1], now) + (iv[0],))
        order = [v for _, v in ranked]
        head = order[0]
        if not (head.has_slo and math.isfinite(head.deadline)):
            return _Plan([], [], order=[v.request for v in order])
        batch = self.policy.batch(head, order[1:], now)
        chosen = {id(v) for v in batch}
        head_key = self._key(head, now)
        sit_out = [r for r in self.running
                   if r.num_computed_tokens < r.num_prompt_tokens and self._key(self._view(r), now) > head_key]
        return _Plan(hold_waiting=[v.request for v in order if id(v) not in chosen], hold_running=sit_out,
                     order=[v.request for v in order])


class _IterationScheduler(_LaxflowScheduler):
    """A ``laxflow.integrations.prefill`` iteration-level batch scheduler sizes and fills each step."""

    policy_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from laxflow.integrations.prefill.registry import create_batch_scheduler

        self.policy = create_batch_scheduler(self.policy_name, self.laxflow_settings.batch_samples(),
                                             **dict(self.laxflow_settings.batch_options))
        self.last_batch: Any = None

    def _sequence(self, request: Any, slo: RequestSlo):
        from laxflow.integrations.prefill.iteration import SequenceView

        return SequenceView(id=request.request_id, arrival=request.arrival_time, ttft_slo=slo.ttft_s or 3600.0,
                            tpot_slo=slo.tpot_s or 3600.0, prompt_tokens=request.num_prompt_tokens,
                            computed_tokens=min(request.num_computed_tokens, request.num_prompt_tokens),
                            output_tokens=request.num_output_tokens, weight=1.0 + max(0, -slo.priority))

    def plan(self, waiting: list[Any], now: float) -> _Plan | None:
        everyone = list(self.running) + waiting
        if not any(self.slo_of(r).given for r in everyone):
            return None
        views = [self._sequence(r, self.slo_of(r)) for r in everyone]
        free = self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size
        batch = self.policy.schedule(views, now, kv_free_tokens=free)
        self.last_batch = batch
        picked = batch.ids
        rank = {rid: i for i, rid in enumerate(picked)}
        order = sorted(waiting, key=lambda r: rank.get(r.request_id, len(rank)))
        return _Plan(hold_waiting=[r for r in waiting if r.request_id not in rank],
                     hold_running=[r for r in self.running if r.request_id not in rank],
                     order=order, budget=max(1, batch.tokens))


class FairBatchingScheduler(_IterationScheduler):
    """FairBatching (time budget = max(min slack, min TPOT), three slack groups, chunking) per vLLM step."""

    policy_name = "fairbatching"


class SlideBatchingScheduler(_IterationScheduler):
    """SlideBatching (URGENT/NORMAL split, sliding time budget) per vLLM step; set ``setting`` via batch options."""

    policy_name = "slidebatching"
