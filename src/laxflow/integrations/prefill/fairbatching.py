"""FairBatching (paper 004, §3.2-3.4): time-budgeted fair batch formation and the PAB.

``FairBatching.schedule`` is Algorithm 1: the step's time budget is
``max(min slack, min TPOT SLO)``; sequences fall in three groups -- urgent
decodes (slack < budget + min TPOT SLO), prefills, other decodes -- each
sorted by slack; they are admitted whole while the linear model
``a + b*new + c*context`` fits the budget, and a prefill that does not
fit is chunked to what is left; urgent decodes join even past the budget
(§3.3: "urgent decode tasks are always included"). ``prefill_admission_budget`` is §3.4's PAB
(Appendix A), which each instance reports to the ``pab`` router.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from laxflow.integrations.prefill.iteration import (
    BatchEntry,
    BatchSample,
    BatchScheduler,
    IterationBatch,
    SequenceView,
    build_config,
    check_count,
)
from laxflow.integrations.prefill.latency import LinearBatchModel


_EPS = 1e-9  # a budget that is an exact multiple of b must not lose a token to float rounding


@dataclass(frozen=True)
class FairBatchingConfig:
    # MAX_TOKEN_BUDGET: kept only as a cap (CUDA-graph sizes), §3.2; the time budget decides.
    max_token_budget: int = 8192

    def __post_init__(self) -> None:
        check_count("FairBatchingConfig", max_token_budget=self.max_token_budget)


class FairBatching(BatchScheduler):
    """Algorithm 1 of FairBatching; one per instance, called before every step."""

    name = "fairbatching"
    config_class = FairBatchingConfig

    def __init__(self, model: LinearBatchModel, config: FairBatchingConfig = FairBatchingConfig()) -> None:
        self.model = model
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "FairBatching":
        return cls(LinearBatchModel.fit(samples), build_config(FairBatchingConfig, options))

    def groups(self, sequences: Sequence[SequenceView], now: float) -> tuple[float, list[list[SequenceView]]]:
        """(init_time_budget, [urgent decodes, prefills, other decodes]) each by slack (lines 13-33)."""
        # Algorithm 1 takes both minima over all active requests (a prefill's
        # slack is the time to its first token's deadline).
        min_slack = min(s.slack(now) for s in sequences)
        min_tpot = min(s.tpot_slo for s in sequences)
        budget = max(min_slack, min_tpot)
        urgent, prefill, other = [], [], []
        for s in sequences:
            if not s.is_prefill and s.slack(now) < budget + min_tpot:
                urgent.append(s)
            elif s.is_prefill:
                prefill.append(s)
            else:
                other.append(s)
        for group in (urgent, prefill, other):
            group.sort(key=lambda s: (s.slack(now), s.arrival, s.id))
        return budget, [urgent, prefill, other]

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        if not sequences:
            return IterationBatch((), 0.0, 0.0)
        m = self.model
        init_budget, groups = self.groups(sequences, now)
        time_left = init_budget - m.a
        tokens_left = self.config.max_token_budget
        if kv_free_tokens is not None:
            tokens_left = min(tokens_left, kv_free_tokens)
        entries: list[BatchEntry] = []
        new_total = ctx_total = 0
        urgent = {id(s) for s in groups[0]}
        for s in (s for group in groups for s in group):
            cost = m.b * s.new_tokens + m.c * s.context
            if cost <= time_left and s.new_tokens <= tokens_left:
                take = s.new_tokens
            elif id(s) in urgent and tokens_left >= 1:
                # §3.3: urgent decodes are always in the batch (skipping one likely
                # misses its next token; a deferred prefill can still move). Line
                # 38 alone would drop them once the time budget is spent; under a
                # decode burst the step then degrades to Sarathi's decode-first.
                take = 1
            elif s.is_prefill and tokens_left > 0 and m.c * s.context <= time_left:
                # Line 43-45: chunk to what the time and token budgets leave. (The
                # paper's line 45 prints "- b*cp + c*context"; the cost charged is
                # b*cp + c*context, as in line 40.)
                take = min(tokens_left, s.remaining_prefill, math.floor((time_left - m.c * s.context) / m.b + _EPS))
                if take < 1:
                    continue
            else:
                # A decode that does not fit cannot be chunked (one token): deferred.
                continue
            entries.append(BatchEntry(s.id, take, s.is_prefill))
            time_left -= m.b * take + m.c * s.context
            tokens_left -= take
            new_total += take
            ctx_total += s.context
        predicted = m.seconds(new_total, ctx_total) if entries else 0.0
        return IterationBatch(tuple(entries), predicted, init_budget)


def prefill_admission_budget(sequences: Sequence[SequenceView], now: float, model: LinearBatchModel,
                             ttft_slo: float, tpot_slo: float) -> float:
    """Prefill Admission Budget of one instance, in tokens (§3.4, Appendix A); may be negative.

    Called by the instance after each step (simulator instance; vLLM
    scheduler) and reported to the ``pab`` router. ``ttft_slo``/``tpot_slo``
    are the cluster's global targets. Worst case: every decode is deferred
    until its slack runs out, so within one TTFT window sequence i still
    needs ``(TTFT - slack_i) / TPOT`` steps (none if its slack exceeds TTFT),
    and each step pays the fixed cost ``a``.
    """
    if not (ttft_slo > 0 and tpot_slo > 0):
        raise ValueError(f"PAB needs ttft_slo > 0 and tpot_slo > 0, got {ttft_slo}, {tpot_slo}")
    a, b, c = model.a, model.b, model.c
    if not sequences:
        return (ttft_slo - a) / (b + c)
    slacks = [s.slack(now) for s in sequences]
    n_batches = (ttft_slo - min(slacks)) / tpot_slo + 1
    reserved = n_batches * a
    tasks = sum(max(0.0, (ttft_slo - sl) / tpot_slo) * (b + s.context * c) for s, sl in zip(sequences, slacks))
    pending_prefill = sum(s.remaining_prefill for s in sequences if s.is_prefill)
    return (ttft_slo - reserved - tasks) / (b + c) - pending_prefill


class FairBatchingPab(FairBatching):
    """FairBatching-PAB (§3.4, §5.1): FairBatching's steps plus admission control by the PAB.

    Before a new request joins the instance, the instance's Prefill Admission
    Budget over what it holds now (admitted prompts not yet prefilled count as
    already allocated) must cover the request's prompt; else the request is
    rejected ("rejecting new task admissions when prefill capacity is nearing
    exhaustion") and counts as an SLO violation (§5.1's metric). The SLOs are
    the arriving request's own. Batches are FairBatching's unchanged.

    Who calls ``admits``: the simulator's engine at each arrival, on the
    event-loop thread, for the instance the router chose (PD-colocated only:
    the budget reserves the instance's own decode steps).
    """

    name = "fairbatching-pab"
    admission = True

    def admits(self, sequences: Sequence[SequenceView], now: float, new: SequenceView) -> bool:
        budget = prefill_admission_budget(sequences, now, self.model, new.ttft_slo, new.tpot_slo)
        return new.remaining_prefill <= budget
