"""``vllm``: vLLM's default scheduler as FairBatching (vLLM-vanilla) and ProServe (vLLM-FCFS) run it.

Prefill-prioritized, FCFS, no chunking (vLLM V0 without chunked prefill): when
any sequence waits for its prefill, the step is a prefill-only batch of whole
prompts in arrival order, as many as fit ``max_num_batched_tokens`` (vLLM's
default ``max(max_model_len, 2048)``: 8192 for the 8k-context models here) and
the free KV; running decodes wait for that step. Only when no prompt fits does
the step decode every running sequence (one token each, ``max_num_seqs`` of
them, oldest first). The first waiting prompt is admitted even when it alone is
over the token budget (vLLM admits prompts up to ``max_model_len``, which the
budget equals), so a long prompt never stalls the queue.

Who calls: the simulator's instance before each step (``Instance.begin_step``)
on the event-loop thread; stateless between steps.
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
    build_config,
    check_count,
    predicted_seconds,
)
from laxflow.integrations.prefill.latency import LinearBatchModel


@dataclass(frozen=True)
class VllmDefaultConfig:
    max_num_batched_tokens: int = 8192  # vLLM V0: max(max_model_len, 2048) without chunked prefill
    max_num_seqs: int = 256  # vLLM's default

    def __post_init__(self) -> None:
        check_count("VllmDefaultConfig", max_num_batched_tokens=self.max_num_batched_tokens,
                    max_num_seqs=self.max_num_seqs)


class VllmDefault(BatchScheduler):
    """Whole prompts first (FCFS), else every decode."""

    name = "vllm"
    config_class = VllmDefaultConfig

    def __init__(self, model: LinearBatchModel | None = None, config: VllmDefaultConfig = VllmDefaultConfig()) -> None:
        self.model = model  # only for IterationBatch.predicted_seconds
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "VllmDefault":
        return cls(LinearBatchModel.fit(samples) if samples else None, build_config(VllmDefaultConfig, options))

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        c = self.config
        kv_left = float("inf") if kv_free_tokens is None else kv_free_tokens
        order = sorted(sequences, key=lambda s: (s.arrival, s.id))
        entries: list[BatchEntry] = []
        tokens = 0
        for s in (s for s in order if s.is_prefill):
            need = s.remaining_prefill
            over_budget = entries and tokens + need > c.max_num_batched_tokens
            if over_budget or need > kv_left or len(entries) >= c.max_num_seqs:
                break  # FCFS: vLLM stops at the first waiting prompt that does not fit
            entries.append(BatchEntry(s.id, need, True))
            tokens += need
            kv_left -= need
        if not entries:
            decodes = [s for s in order if not s.is_prefill][:c.max_num_seqs]
            entries = [BatchEntry(s.id, 1, False) for s in decodes[:int(min(len(decodes), kv_left))]]
        predicted = predicted_seconds(self.model, entries, sequences)
        return IterationBatch(tuple(entries), predicted, predicted)
