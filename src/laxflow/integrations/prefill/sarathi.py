"""Sarathi-Serve's stall-free batching (baseline of FairBatching and ProServe).

Every running decode joins the step first (decode-first, FCFS), then prefills
in FCFS order fill the static token budget, the last one chunked to what is
left. The ``edf``, ``sjf`` and ``priority`` baselines (ProServe §5.1) are the
same step with another prefill order; they live in their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from laxflow.integrations.prefill.iteration import (
    BatchEntry,
    BatchSample,
    BatchScheduler,
    IterationBatch,
    SequenceView,
    TokenBudgetConfig,
    build_config,
    predicted_seconds,
)
from laxflow.integrations.prefill.latency import LinearBatchModel


@dataclass(frozen=True)
class SarathiConfig(TokenBudgetConfig):
    """``token_budget`` new tokens per step (512 by default)."""


class Sarathi(BatchScheduler):
    """Decodes first, then prefills by ``prefill_key`` within a static token budget."""

    name = "sarathi"
    config_class = SarathiConfig

    def __init__(self, model: LinearBatchModel | None = None, config: SarathiConfig = SarathiConfig()) -> None:
        self.model = model  # only for IterationBatch.predicted_seconds; the budget is in tokens
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "Sarathi":
        return cls(LinearBatchModel.fit(samples) if samples else None, build_config(cls.config_class, options))

    def prefill_key(self, s: SequenceView, now: float) -> tuple:
        return (s.arrival, s.id)

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        left = self.config.token_budget if kv_free_tokens is None else min(self.config.token_budget, kv_free_tokens)
        decodes = sorted((s for s in sequences if not s.is_prefill), key=lambda s: (s.arrival, s.id))
        prefills = sorted((s for s in sequences if s.is_prefill), key=lambda s: self.prefill_key(s, now))
        entries: list[BatchEntry] = []
        for s in decodes:
            if left < 1:
                break
            entries.append(BatchEntry(s.id, 1, False))
            left -= 1
        for s in prefills:
            if left < 1:
                break
            take = min(left, s.remaining_prefill)
            entries.append(BatchEntry(s.id, take, True))
            left -= take
        predicted = predicted_seconds(self.model, entries, sequences)
        return IterationBatch(tuple(entries), predicted, predicted)
