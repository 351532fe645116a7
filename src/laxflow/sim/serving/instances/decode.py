"""Decode instances: their batch former (every decode, within KV memory).

:class:`DecodeAll` is called by :class:`.instance.Instance` before each step when its role is
``decode``. A decode instance holds sequences whose prompt KV arrived over
the network; each step runs one token of every one of them (continuous
batching, as vLLM and DistServe decode instances do), oldest first when KV
is short. A sequence that was preempted there (recompute) prefills again in
chunks of at most ``token_budget`` tokens after the decodes.

The unit engine's decode units (``ServingConfig.decode = "steps"``) are such
instances too, one per decode unit (``simulator.ServingSimulator``).
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
)


@dataclass(frozen=True)
class DecodeAllConfig(TokenBudgetConfig):
    """``token_budget``: the recompute chunk after the decodes (512, Sarathi's default)."""


class DecodeAll(BatchScheduler):
    name = "decode-all"
    config_class = DecodeAllConfig

    def __init__(self, config: DecodeAllConfig = DecodeAllConfig()) -> None:
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "DecodeAll":
        return cls(build_config(DecodeAllConfig, options))

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        left = float("inf") if kv_free_tokens is None else kv_free_tokens
        entries: list[BatchEntry] = []
        for s in sorted((s for s in sequences if not s.is_prefill), key=lambda s: (s.arrival, s.id)):
            if left < 1:
                break
            entries.append(BatchEntry(s.id, 1, False))
            left -= 1
        budget = self.config.token_budget
        for s in sorted((s for s in sequences if s.is_prefill), key=lambda s: (s.arrival, s.id)):
            take = int(min(budget, left, s.remaining_prefill))
            if take < 1:
                break
            entries.append(BatchEntry(s.id, take, True))
            budget -= take
            left -= take
        return IterationBatch(tuple(entries), 0.0, 0.0)
