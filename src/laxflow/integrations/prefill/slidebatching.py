"""SlideBatching (ProServe, paper 003 §4.2, Algorithm 1): gain-aware batch formation.

The latency budget is the smallest remaining time to a next-token deadline,
floored at ``eta``. A sequence is URGENT when its remaining time is below
``gamma * phi`` -- phi estimates how long the queue takes: ``phi_a`` (every
request at the end of the queue, Eq. 8) or ``phi_c`` (its place in the
deadline order, Eq. 9) on a colocated instance, ``phi_p`` (one request per
batch) on a disaggregated prefill instance. URGENT sequences go first by
density (next token's TDG weight per second of execution, the fractional
knapsack order), then NORMAL ones by remaining time; the batch fills the
budget, prefills chunked to what is left (GETMAXCHUNK).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from laxflow.integrations.metrics.tdg import TdgWeights, token_weight
from laxflow.integrations.prefill.iteration import (
    BatchEntry,
    BatchSample,
    BatchScheduler,
    IterationBatch,
    SequenceView,
    build_config,
    check_choice,
    check_positive,
)
from laxflow.integrations.prefill.latency import ProServeLatencyModel

SETTINGS = ("colocated", "disaggregated")
PHIS = ("a", "c")


@dataclass(frozen=True)
class SlideBatchingConfig:
    setting: str = "colocated"  # colocated: phi_a / phi_c; disaggregated (prefill-only instance): phi_p
    phi: str = "a"  # colocated load judgment; ProServe reports all results with phi_a (§4.4)
    eta: float = 0.02  # s, floor of the latency budget; the paper gives no value -- ours, fixed
    gamma: float = 1.0  # aggressiveness: > 1 marks more URGENT (density first)
    w_p: float = 1.0  # TDG first-token weight
    w_d: float = 1.0  # TDG decode-token weight
    theta: float = 0.9  # momentum of the estimator's online correction

    def __post_init__(self) -> None:
        check_choice("SlideBatchingConfig", "setting", self.setting, SETTINGS)
        check_choice("SlideBatchingConfig", "phi", self.phi, PHIS)
        check_positive("SlideBatchingConfig", eta=self.eta, gamma=self.gamma)
        TdgWeights(self.w_p, self.w_d)
        if not 0 <= self.theta < 1:
            raise ValueError(f"SlideBatchingConfig.theta: must be in [0, 1), got {self.theta!r}")

    @property
    def weights(self) -> TdgWeights:
        return TdgWeights(self.w_p, self.w_d)


@dataclass(frozen=True)
class Judged:
    """A sequence with Algorithm 1's metrics (lines 2-12)."""

    seq: SequenceView
    exec: float
    remain: float
    density: float
    urgent: bool


class SlideBatching(BatchScheduler):
    """Algorithm 1 of ProServe; one per instance, called before every step."""

    name = "slidebatching"
    config_class = SlideBatchingConfig

    def __init__(self, model: ProServeLatencyModel, config: SlideBatchingConfig = SlideBatchingConfig()) -> None:
        self.model = model
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "SlideBatching":
        config = build_config(SlideBatchingConfig, options)
        return cls(ProServeLatencyModel.fit(samples, config.theta), config)

    def exec_time(self, s: SequenceView) -> float:
        """T~_pd(r): the whole remaining prefill, or one decode token (Eq. 5-6)."""
        return self.model.prefill(s.remaining_prefill, s.computed_tokens) if s.is_prefill else self.model.decode(s.context)

    def judge(self, sequences: Sequence[SequenceView], now: float) -> tuple[float, list[Judged], list[Judged]]:
        """(t_budget, URGENT by density desc, NORMAL by remaining time asc) -- lines 1-13."""
        cfg, t_c = self.config, self.model.overhead
        execs = [self.exec_time(s) for s in sequences]
        remains = [s.slack(now) for s in sequences]
        t_budget = max(min(remains), cfg.eta)
        if cfg.setting == "disaggregated":
            phi_all = sum(execs) + len(sequences) * t_c  # phi_p: one request per batch
            phis = [phi_all] * len(sequences)
        else:
            # Steps needed = sum exec / (t_budget - t_c); each takes t_budget.
            scale = t_budget / (t_budget - t_c) if t_budget > t_c else math.inf
            if cfg.phi == "a":
                phis = [scale * sum(execs)] * len(sequences)
            else:
                order = sorted(range(len(sequences)), key=lambda k: (remains[k], sequences[k].id))
                phis = [0.0] * len(sequences)
                prefix = 0.0
                for k in order:
                    prefix += execs[k]
                    phis[k] = scale * prefix
        judged = []
        for s, e, rem, phi in zip(sequences, execs, remains, phis):
            w = token_weight(s.output_tokens + 1, s.weight, cfg.weights)
            density = w / e if e > 0 else math.inf
            judged.append(Judged(s, e, rem, density, rem < cfg.gamma * phi))
        urgent = sorted((j for j in judged if j.urgent), key=lambda j: (-j.density, j.remain, j.seq.id))
        normal = sorted((j for j in judged if not j.urgent), key=lambda j: (j.remain, j.seq.id))
        return t_budget, urgent, normal

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        if not sequences:
            return IterationBatch((), 0.0, 0.0)
        t_budget, urgent, normal = self.judge(sequences, now)
        t_batch = self.model.overhead
        kv_left = math.inf if kv_free_tokens is None else kv_free_tokens
        entries: list[BatchEntry] = []
        for j in urgent + normal:
            if t_batch >= t_budget or kv_left < 1:
                break
            s, left = j.seq, t_budget - t_batch
            if s.is_prefill:
                take = self.model.max_chunk(s.computed_tokens, int(min(s.remaining_prefill, kv_left)), left)
                cost = self.model.prefill(take, s.computed_tokens)
            else:
                # A decode is one token; it cannot be chunked, so it waits if it does not fit.
                take, cost = (1, j.exec) if j.exec <= left else (0, 0.0)
            if take < 1:
                continue
            entries.append(BatchEntry(s.id, take, s.is_prefill))
            t_batch += cost
            kv_left -= take
        return IterationBatch(tuple(entries), t_batch if entries else 0.0, t_budget)
