"""``qwen-multislo``: FlowPrefill's evaluation workload (its Tables 1 and 2), synthesized.

Called by ``synthetic.generate("qwen-multislo", ...)`` and, for the SLOs, by
the serving simulator at each arrival (``category_slo``). FlowPrefill
evaluates on QwenTrace converted to single-turn queries with random tokens
(no prefix reuse); we have its Table 1 only, so each request draws its
category by the table's ratio and its prompt length from a lognormal with
that category's mean and p99 (two equations fix mu and sigma; the std this
implies is within 10 % of Table 1's). Arrivals are Poisson at ``rate``. Output
length does not enter FlowPrefill's TTFT metric; every request asks 1 token.
"""

from __future__ import annotations

import math

import numpy as np

from laxflow.errors import UserError
from laxflow.sim.workload.request import Request

# FlowPrefill Table 1: (mean, p99, share) of prompt tokens per task type.
CATEGORIES: dict[str, tuple[float, float, float]] = {
    "text": (590.0, 3040.0, 0.68),
    "image": (532.0, 2764.0, 0.08),
    "search": (5976.0, 16635.0, 0.20),
    "file": (6833.0, 22390.0, 0.04),
}
# FlowPrefill Table 2: TTFT SLO (s) per model and task type.
SLOS: dict[str, dict[str, float]] = {
    "llama3-8b": {"text": 0.25, "image": 0.5, "search": 4.0, "file": 6.0},
    "qwen2.5-14b": {"text": 0.4, "image": 0.8, "search": 6.5, "file": 9.0},
    "llama3-70b": {"text": 1.0, "image": 2.0, "search": 15.0, "file": 18.0},
}
_Z99 = 2.3263478740408408  # standard normal 99th percentile


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 99th percentile (the smaller sigma root)."""
    r = math.log(p99 / mean)
    disc = _Z99 * _Z99 - 2.0 * r
    if r <= 0 or disc < 0:
        raise ValueError(f"no lognormal has mean {mean} and p99 {p99}")
    sigma = _Z99 - math.sqrt(disc)
    return math.log(mean) - sigma * sigma / 2.0, sigma


def category_slo(model: str, category: str) -> float | None:
    """Table 2's TTFT SLO for ``model`` (None: the model is not in the table)."""
    return SLOS.get(model, {}).get(category)


def generate_multislo(rate: float, num_requests: int, seed: int) -> list[Request]:
    """``num_requests`` requests at ``rate`` requests/s (whole cluster); deterministic per seed."""
    if not rate > 0:
        raise UserError(f"workload 'qwen-multislo': rate: expected a positive number of requests/s, got {rate!r}")
    if num_requests < 1:
        raise UserError(f"workload 'qwen-multislo': num_requests: expected at least 1, got {num_requests}")
    rng = np.random.default_rng([seed, 13])
    names = list(CATEGORIES)
    shares = np.array([CATEGORIES[n][2] for n in names])
    picks = rng.choice(len(names), size=num_requests, p=shares / shares.sum())
    lengths = np.empty(num_requests)
    for k, name in enumerate(names):
        mask = picks == k
        mu, sigma = lognormal_params(CATEGORIES[name][0], CATEGORIES[name][1])
        lengths[mask] = rng.lognormal(mu, sigma, size=int(mask.sum()))
    gaps = rng.exponential(1.0 / rate, size=num_requests)
    times = np.cumsum(gaps) - gaps[0]
    return [Request(id=f"m{i}", arrival=float(times[i]), input_tokens=max(1, int(round(lengths[i]))),
                    output_tokens=1, category=names[picks[i]]) for i in range(num_requests)]
