"""``weighted-vtc``: Weighted Virtual Token Counter fairness (ProServe §5.1's baseline, VTC OSDI'24).

VTC keeps one counter per client of the tokens it was served; a new request is
admitted from the backlogged client with the smallest counter, so served
tokens equalize across clients. Weighted VTC divides each charge by the
client's weight, so served tokens approach the ratio of the weights (ProServe:
high priority 2, low 1). Charges are VTC's defaults: ``w_in`` per prompt token
computed, ``w_out`` per output token decoded. A client that becomes backlogged
again is lifted to the smallest counter among the clients that stayed
backlogged (or to the counter of the last client that left), so idling earns no
credit (VTC Algorithm 2). It knows no SLO.

The step frame is the other ProServe baselines' (Sarathi's stall-free chunked
prefill, decode first, the same static token budget): every running decode
(charged ``w_out``), then prefills already started (arrival order), then new
prompts picked by counter (FCFS inside a client), the last one chunked.
Clients are priority weights (``SequenceView.weight``): ProServe's clients are
its priority classes.

Who calls: the simulator's instance before each step on the event-loop thread.
Unlike the other batch schedulers it keeps state between steps (the
counters), so each instance has its own; the engine runs every batch it
returns, so charging at ``schedule`` time charges what is served.
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
    TokenBudgetConfig,
    build_config,
    predicted_seconds,
)
from laxflow.integrations.prefill.latency import LinearBatchModel


@dataclass(frozen=True)
class WeightedVtcConfig(TokenBudgetConfig):
    """The same static ``token_budget`` as sarathi/priority, and VTC's charges."""

    w_in: float = 1.0  # VTC's charge per prompt token
    w_out: float = 2.0  # VTC's charge per output token

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("w_in", "w_out"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"WeightedVtcConfig.{name}: must be a finite number >= 0, got {v!r}")


class WeightedVtc(BatchScheduler):
    """Decodes first, then started prefills, then new prompts from the least-served client."""

    name = "weighted-vtc"
    config_class = WeightedVtcConfig

    def __init__(self, model: LinearBatchModel | None = None, config: WeightedVtcConfig = WeightedVtcConfig()) -> None:
        self.model = model
        self.config = config
        self.counters: dict[float, float] = {}  # client (priority weight) -> weighted tokens served
        self._backlogged: set[float] = set()  # clients with new prompts waiting at the last call
        self._last_left = 0.0  # counter of the last client whose backlog emptied

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "WeightedVtc":
        return cls(LinearBatchModel.fit(samples) if samples else None, build_config(WeightedVtcConfig, options))

    def _charge(self, client: float, tokens: float) -> None:
        self.counters[client] = self.counters.get(client, 0.0) + tokens / client

    def _lift(self, waiting: dict[float, list[SequenceView]]) -> None:
        stayed = self._backlogged & set(waiting)
        for client in self._backlogged - set(waiting):
            self._last_left = self.counters.get(client, 0.0)
        floor = min(self.counters.get(k, 0.0) for k in stayed) if stayed else self._last_left
        for client in set(waiting) - self._backlogged:
            self.counters[client] = max(self.counters.get(client, 0.0), floor)
        self._backlogged = set(waiting)

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        c = self.config
        left = c.token_budget if kv_free_tokens is None else min(c.token_budget, kv_free_tokens)
        by_arrival = sorted(sequences, key=lambda s: (s.arrival, s.id))
        waiting: dict[float, list[SequenceView]] = {}
        for s in by_arrival:
            if s.is_prefill and s.computed_tokens == 0:
                waiting.setdefault(s.weight, []).append(s)
        self._lift(waiting)
        entries: list[BatchEntry] = []

        def take(s: SequenceView, tokens: int, prefill: bool) -> None:
            nonlocal left
            entries.append(BatchEntry(s.id, tokens, prefill))
            self._charge(s.weight, tokens * (c.w_in if prefill else c.w_out))
            left -= tokens

        for s in (s for s in by_arrival if not s.is_prefill):
            if left < 1:
                break
            take(s, 1, False)
        for s in (s for s in by_arrival if s.is_prefill and s.computed_tokens > 0):
            if left < 1:
                break
            take(s, min(left, s.remaining_prefill), True)
        while left >= 1 and waiting:
            client = min(waiting, key=lambda k: (self.counters.get(k, 0.0), -k))
            s = waiting[client].pop(0)
            if not waiting[client]:
                del waiting[client]
            take(s, min(left, s.remaining_prefill), True)
        predicted = predicted_seconds(self.model, entries, sequences)
        return IterationBatch(tuple(entries), predicted, predicted)
