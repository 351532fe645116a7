"""Iteration-level batch schedulers: one snapshot of the running sequences in, one batch out.

FairBatching, SlideBatching (ProServe) and the Sarathi-style baselines decide,
before every forward step of an instance, which sequences take part and how
many new tokens each computes: decodes (one token) and prefill chunks mixed in
one batch (PD-colocated), or prefill chunks only (a disaggregated prefill
instance). Unlike ``base.PrefillScheduler`` (events in, Submit/Preempt out)
they keep no queue of their own: the caller owns the sequences.

Who calls: the serving simulator's instance at the start of each iteration,
and the vLLM scheduler class (``schedule()`` in the engine's busy loop), on
that one thread. Protocol, per step:

1. Build one ``SequenceView`` per unfinished sequence the instance holds.
2. ``batch = scheduler.schedule(views, now, kv_free_tokens)``.
3. Run ``batch.entries``: each entry computes ``new_tokens`` tokens of its
   sequence (a prefill chunk, or the one decode token); a prefill entry whose
   chunk completes the prompt yields the first output token.

Deadlines follow both papers' per-token envelope: output token ``j`` (0-based,
``j = 0`` is the first token) is due at ``arrival + ttft_slo + j * tpot_slo``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Sequence


def token_deadline(arrival: float, ttft_slo: float, tpot_slo: float, j: int) -> float:
    """Absolute deadline of output token ``j`` (0-based) -- FairBatching §3.1, ProServe Eq. 3."""
    return arrival + ttft_slo + j * tpot_slo


@dataclass(frozen=True)
class SequenceView:
    """One unfinished request as an instance sees it before a step (built by the caller).

    ``computed_tokens`` of the ``prompt_tokens`` are already prefilled (their
    KV is cached); ``output_tokens`` were emitted. A sequence decodes once its
    prompt is computed. ``weight`` is ProServe's priority weight w_p(r).
    A sequence recomputing after a preemption (vLLM's recompute mode) counts
    the outputs it rebuilds in ``prompt_tokens`` and says how many in
    ``folded_outputs``; its next token keeps its index (``output_tokens``).
    """

    id: str
    arrival: float
    ttft_slo: float
    tpot_slo: float
    prompt_tokens: int
    computed_tokens: int = 0
    output_tokens: int = 0
    weight: float = 1.0
    folded_outputs: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"sequence {self.id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if not 0 <= self.computed_tokens <= self.prompt_tokens:
            raise ValueError(f"sequence {self.id}: computed_tokens must be in [0, prompt_tokens], got {self.computed_tokens}")
        if not 0 <= self.folded_outputs <= self.output_tokens:
            raise ValueError(f"sequence {self.id}: need 0 <= folded_outputs <= output_tokens")
        if self.computed_tokens < self.prompt_tokens and self.output_tokens != self.folded_outputs:
            raise ValueError(f"sequence {self.id}: while prefilling, output_tokens must equal folded_outputs "
                             f"(0 unless recomputing), got {self.output_tokens} and {self.folded_outputs}")
        if not (self.ttft_slo > 0 and self.tpot_slo > 0 and math.isfinite(self.arrival)):
            raise ValueError(f"sequence {self.id}: ttft_slo and tpot_slo must be > 0, arrival finite")
        if not self.weight > 0:
            raise ValueError(f"sequence {self.id}: weight must be > 0, got {self.weight}")

    @property
    def is_prefill(self) -> bool:
        return self.computed_tokens < self.prompt_tokens

    @property
    def remaining_prefill(self) -> int:
        return self.prompt_tokens - self.computed_tokens

    @property
    def new_tokens(self) -> int:
        """Tokens the sequence would compute if admitted whole: its prompt rest, or 1 decode token."""
        return self.remaining_prefill if self.is_prefill else 1

    @property
    def context(self) -> int:
        """KV tokens the step reads before its new ones (cached prompt, plus outputs fed back)."""
        if self.is_prefill:
            return self.computed_tokens
        return self.prompt_tokens + self.output_tokens - self.folded_outputs - 1

    def deadline(self) -> float:
        """Deadline of the next output token (FairBatching's request_ddl)."""
        return token_deadline(self.arrival, self.ttft_slo, self.tpot_slo, self.output_tokens)

    def slack(self, now: float) -> float:
        return self.deadline() - now

    def after(self, entry: "BatchEntry") -> "SequenceView":
        """The view once ``entry`` ran: a chunk adds computed tokens (the last one emits the first
        output token), a decode emits one token. For executors that keep views between steps."""
        if entry.id != self.id or entry.is_prefill != self.is_prefill or not 1 <= entry.new_tokens <= self.new_tokens:
            raise ValueError(f"entry {entry} does not fit sequence {self.id}")
        if not self.is_prefill:
            return replace(self, output_tokens=self.output_tokens + 1)
        computed = self.computed_tokens + entry.new_tokens
        emitted = 1 if computed == self.prompt_tokens else 0
        return replace(self, computed_tokens=computed, output_tokens=self.output_tokens + emitted)


@dataclass(frozen=True)
class BatchEntry:
    """``new_tokens`` tokens of sequence ``id`` run in this step (a chunk when < the prompt rest)."""

    id: str
    new_tokens: int
    is_prefill: bool


@dataclass(frozen=True)
class IterationBatch:
    """What one step runs, with the scheduler's own time estimate and budget (for metrics)."""

    entries: tuple[BatchEntry, ...]
    predicted_seconds: float
    time_budget: float

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.entries]

    @property
    def tokens(self) -> int:
        return sum(e.new_tokens for e in self.entries)


@dataclass(frozen=True)
class BatchSample:
    """One profiled step: ``(new_tokens, context, is_prefill)`` per sequence, and its seconds.

    The simulator profiles its compute model into these, the engine times
    its own forward passes; every latency model fits itself from the same list.
    """

    entries: tuple[tuple[int, int, bool], ...]
    seconds: float


def check_choice(owner: str, field_name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise one line naming the field and the valid choices."""
    if value not in choices:
        raise ValueError(f"{owner}.{field_name}: {value!r} is not one of {', '.join(map(str, choices))}")


def check_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{owner}.{name}: must be a finite number > 0, got {value!r}")


def check_count(owner: str, **values: Any) -> None:
    """Raise one line naming the field unless each value is an integer >= 1 (a count of tokens or sequences)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name}: must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class TokenBudgetConfig:
    """The config of a scheduler with a static per-step token budget, validated here once.

    ``sarathi`` (and its ``edf``/``sjf``/``priority`` orders), ``weighted-vtc``
    and the decode instance's batch former subclass it under their own names,
    which their errors name (``SarathiConfig.token_budget: ...``).
    """

    # Sarathi-Serve's default chunk budget; the same for every workload (never tuned to a preset).
    token_budget: int = 512

    def __post_init__(self) -> None:
        check_count(type(self).__name__, token_budget=self.token_budget)


def predicted_seconds(model: Any, entries: Sequence[BatchEntry], sequences: Sequence[SequenceView]) -> float:
    """What ``model`` (a ``LinearBatchModel``; None: no model) predicts for a step running ``entries``
    of ``sequences``; 0 for an empty step. For the token-budget schedulers' ``IterationBatch``."""
    if model is None or not entries:
        return 0.0
    by_id = {s.id: s for s in sequences}
    return model.seconds(sum(e.new_tokens for e in entries), sum(by_id[e.id].context for e in entries))


def build_config(config_class: type, options: dict[str, Any]) -> Any:
    """A config dataclass from keyword options; an unknown key names the valid fields."""
    valid = [f.name for f in fields(config_class)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        expected = f"expected one of {', '.join(valid)}" if valid else "it takes no options"
        raise ValueError(f"{config_class.__name__}: unknown option {unknown[0]!r} ({expected})")
    return config_class(**options)


class BatchScheduler(ABC):
    """Forms one step's batch; stateless between steps except for a fitted latency model."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type]

    @classmethod
    @abstractmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "BatchScheduler":
        """A scheduler whose latency model is fitted to ``samples``; ``options`` fill its config."""

    @abstractmethod
    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        """The next step's batch; ``kv_free_tokens`` caps the new tokens it may add (None: no cap)."""
