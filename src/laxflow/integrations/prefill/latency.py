"""Batch-time models fitted by least squares to profiled steps (``BatchSample``).

- ``LinearBatchModel`` -- FairBatching §3.2: ``a + b * total_new_tokens + c * total_context``.
- ``ProServeLatencyModel`` -- ProServe §4.1 Eq. 4-7: per prefill request
  ``a_p l_q^2 + b_p l_q l_kv + c_p l_q``, per decode ``a_d l_kv + b_d``, plus a
  constant ``t_c`` per batch; an online correction factor beta (momentum theta).

Built once per model and hardware (simulator: from its compute model; engine:
from timed forwards), then read by the schedulers and routers on their thread.
Coefficients are fitted without sign constraints; a negative prediction is
floored at zero where it is used.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from laxflow.integrations.prefill.iteration import BatchSample


def _solve(rows: list[list[float]], seconds: list[float], names: str, need: int) -> np.ndarray:
    if len(rows) < need:
        raise ValueError(f"need at least {need} profiled batch samples to fit {names}, got {len(rows)}")
    x, y = np.asarray(rows, dtype=float), np.asarray(seconds, dtype=float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y >= 0)):
        raise ValueError("batch samples must be finite with seconds >= 0")
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef


class LinearBatchModel:
    """FairBatching's step time ``a + b * new_tokens + c * context`` (sums over the batch)."""

    def __init__(self, a: float, b: float, c: float) -> None:
        if not (all(math.isfinite(v) for v in (a, b, c)) and b > 0 and a >= 0 and c >= 0):
            raise ValueError(f"linear batch model needs a >= 0, b > 0, c >= 0, got a={a}, b={b}, c={c}")
        self.a, self.b, self.c = float(a), float(b), float(c)

    @classmethod
    def fit(cls, samples: Sequence[BatchSample]) -> "LinearBatchModel":
        rows = [[1.0, sum(n for n, _, _ in s.entries), sum(k for _, k, _ in s.entries)] for s in samples]
        a, b, c = _solve(rows, [s.seconds for s in samples], "a + b*new + c*context", 3)
        # Least squares may return a tiny negative intercept or context term on
        # noiseless profiles; both are physical costs, so clamp at zero.
        return cls(max(0.0, a), b, max(0.0, c))

    def seconds(self, new_tokens: int, context: int) -> float:
        return self.a + self.b * new_tokens + self.c * context


class ProServeLatencyModel:
    """ProServe's estimator; ``beta`` scales every estimate (online correction, §4.1)."""

    def __init__(self, a_p: float, b_p: float, c_p: float, a_d: float, b_d: float, t_c: float,
                 theta: float = 0.9) -> None:
        values = dict(a_p=a_p, b_p=b_p, c_p=c_p, a_d=a_d, b_d=b_d, t_c=t_c)
        if not all(math.isfinite(v) for v in values.values()) or t_c < 0:
            raise ValueError(f"ProServe latency model needs finite coefficients and t_c >= 0, got {values}")
        if not 0 <= theta < 1:
            raise ValueError(f"ProServeLatencyModel.theta: must be in [0, 1), got {theta}")
        self.a_p, self.b_p, self.c_p, self.a_d, self.b_d, self.t_c = (float(v) for v in values.values())
        self.theta = theta
        self.beta = 1.0

    @classmethod
    def fit(cls, samples: Sequence[BatchSample], theta: float = 0.9) -> "ProServeLatencyModel":
        rows = []
        for s in samples:
            pre = [(n, k) for n, k, p in s.entries if p]
            dec = [k for _, k, p in s.entries if not p]
            rows.append([sum(n * n for n, _ in pre), sum(n * k for n, k in pre), sum(n for n, _ in pre),
                         float(sum(dec)), float(len(dec)), 1.0])
        coef = _solve(rows, [s.seconds for s in samples], "ProServe Eq. 4-7", 6)
        a_p, b_p, c_p, a_d, b_d, t_c = coef
        return cls(a_p, b_p, c_p, a_d, b_d, max(0.0, t_c), theta)

    def prefill(self, l_q: int, l_kv: int) -> float:
        """Eq. 5 times beta: a prefill (chunk) of ``l_q`` new tokens over ``l_kv`` cached ones."""
        return self.beta * max(0.0, self.a_p * l_q * l_q + self.b_p * l_q * l_kv + self.c_p * l_q)

    def decode(self, l_kv: int) -> float:
        """Eq. 6 times beta: one decode token over ``l_kv`` cached tokens."""
        return self.beta * max(0.0, self.a_d * l_kv + self.b_d)

    @property
    def overhead(self) -> float:
        return self.beta * self.t_c

    def max_chunk(self, l_kv: int, limit: int, seconds: float) -> int:
        """Largest ``l_q <= limit`` with ``prefill(l_q, l_kv) <= seconds`` (0 if none); Eq. 5 grows in l_q."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.prefill(mid, l_kv) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def observe(self, real: Sequence[float], estimated: Sequence[float]) -> None:
        """Online update from a window of steps: beta <- theta beta + (1 - theta) mean(real / est).

        Called by the executor after it timed a window of batches, with the
        estimates the scheduler made for them (already including beta).
        """
        ratios = [r / e for r, e in zip(real, estimated) if e > 0]
        if ratios:
            self.beta = self.theta * self.beta + (1 - self.theta) * self.beta * float(np.mean(ratios))
