"""ProServe's Token-level Deadline-aware Gain (TDG, paper 003 §2 Eq. 3).

    f_TDG(r) = sum_i w_r(i) * I[t_{r,i} < deadline_{r,i}],
    deadline_{r,i} = arrival + TTFT_SLO + (i - 1) * TPOT_SLO,
    w_r(i) = w_p * w_{p(r)} for the first token, w_d * w_{p(r)} after.

Who calls: the simulator when a request finishes (per-run ``tdg_gain`` and
``TDG_Ratio``), the SlideBatching scheduler (the weight of a sequence's next
token) and the GoRouting router (gain estimates). Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class TdgWeights:
    """First-token weight ``w_p`` and decode-token weight ``w_d`` (ProServe sets their ratio from
    the dataset's mean input/output ratio; 1 and 1 unless a caller does so for every policy alike)."""

    w_p: float = 1.0
    w_d: float = 1.0

    def __post_init__(self) -> None:
        for name in ("w_p", "w_d"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"TdgWeights.{name}: must be a finite number >= 0, got {value!r}")


def token_weight(i: int, priority_weight: float, weights: TdgWeights = TdgWeights()) -> float:
    """w_r(i) for 1-based output token ``i``."""
    if i < 1:
        raise ValueError(f"token index is 1-based, got {i}")
    return (weights.w_p if i == 1 else weights.w_d) * priority_weight


def tdg_gain(arrival: float, ttft_slo: float, tpot_slo: float, token_times: Sequence[float],
             priority_weight: float = 1.0, weights: TdgWeights = TdgWeights()) -> float:
    """Gain of one request from the absolute times its output tokens were emitted, in order."""
    gain = 0.0
    for i, t in enumerate(token_times, start=1):
        # Strictly before the deadline (Eq. 3 uses <).
        if t < arrival + ttft_slo + (i - 1) * tpot_slo:
            gain += token_weight(i, priority_weight, weights)
    return gain


def tdg_ideal(output_tokens: int, priority_weight: float = 1.0, weights: TdgWeights = TdgWeights()) -> float:
    """Gain if every one of ``output_tokens`` tokens met its deadline (the TDG_Ratio denominator)."""
    if output_tokens < 1:
        return 0.0
    return priority_weight * (weights.w_p + (output_tokens - 1) * weights.w_d)


def tdg_ratio(gains: Sequence[float], ideals: Sequence[float]) -> float:
    """TDG_Ratio = sum f_TDG / Ideal_Gain over a run (ProServe §5.1); NaN when nothing was ideal."""
    total = sum(ideals)
    return sum(gains) / total if total > 0 else float("nan")
