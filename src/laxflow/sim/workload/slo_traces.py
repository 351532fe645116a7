"""Workloads of the batching papers (FairBatching, ProServe, Arrow), each with its TTFT and TPOT SLO.

Called by ``synthetic.generate(name, rate, n, seed)`` for the names in
:data:`SLO_WORKLOADS`, and by the iteration-level serving simulator
(``laxflow.sim.serving.instances``) for each workload's SLO pair
(:func:`slo_of`) and priority rule. A real trace file of the same source is
replayed through ``traces.load_trace`` instead (``--trace``); its SLO then
comes from :data:`TRACE_FORMAT_SLO`.

Each request draws its prompt and output lengths from lognormals fitted to
the published statistics named in ``source`` (mean and p90, or a median with a
spread of ours where only a median is published), independently. Arrivals are
Poisson at ``rate``, or, for the traces Arrow calls bursty, a Poisson process
whose rate is redrawn every ``burst_window`` arrivals from a lognormal with
coefficient of variation ``burst_cv`` (Arrow §3: per-minute input-length c_v
0.80 on Azure Code, 1.11 on BurstGPT), so the mean rate stays ``rate``.

Priorities (ProServe §5.1): where ``priorities`` is set, each request is
high priority (weight 2) or low (weight 1) with probability 1/2, seeded;
the simulator reads the weight from ``Request.category`` ("high"/"low").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from laxflow.errors import UserError
from laxflow.sim.workload.request import Request

_Z90 = 1.2815515655446004  # standard normal 90th percentile
PRIORITY_WEIGHTS = {"high": 2.0, "low": 1.0}  # ProServe §5.1: fixed at 2 and 1


@dataclass(frozen=True, kw_only=True)
class SloWorkload:
    """A synthetic workload with its SLO. Lengths: lognormal (mu, sigma) in tokens."""

    name: str
    source: str
    ttft_slo: float  # s
    tpot_slo: float  # s
    input_mu: float
    input_sigma: float
    output_mu: float
    output_sigma: float
    max_input: int = 32768
    max_output: int = 4096
    burst_cv: float = 0.0  # 0: plain Poisson
    burst_window: int = 64  # arrivals per rate window (bursty workloads)
    priorities: bool = False  # ProServe's 50/50 high/low split

    def mean_input(self) -> float:
        return math.exp(self.input_mu + self.input_sigma ** 2 / 2)

    def mean_output(self) -> float:
        return math.exp(self.output_mu + self.output_sigma ** 2 / 2)


def from_mean_p90(mean: float, p90: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 90th percentile (the smaller sigma root).

    A lognormal's p90 is at most e^(z^2/2) = 2.27 times its mean; a p90 beyond that
    (BurstGPT's prompts: 2.32) gets the widest one, sigma = z: mean exact, p90 2 % short.
    """
    r = math.log(p90 / mean)
    disc = max(0.0, _Z90 * _Z90 - 2.0 * r)
    sigma = _Z90 - math.sqrt(disc)
    return math.log(mean) - sigma * sigma / 2.0, sigma


def from_median(median: float, sigma: float) -> tuple[float, float]:
    return math.log(median), sigma


def from_mean(mean: float, sigma: float) -> tuple[float, float]:
    return math.log(mean) - sigma * sigma / 2.0, sigma


def _spec(name: str, source: str, slo: tuple[float, float], inp: tuple[float, float], out: tuple[float, float],
          **kw) -> SloWorkload:
    return SloWorkload(name=name, source=source, ttft_slo=slo[0], tpot_slo=slo[1], input_mu=inp[0],
                       input_sigma=inp[1], output_mu=out[0], output_sigma=out[1], **kw)


# Spreads marked "ours" are not published; they are the same 1.0 log-space sigma wherever a median is all we have.
SLO_WORKLOADS: dict[str, SloWorkload] = {w.name: w for w in (
    _spec("azure-code", "Azure LLM inference 2023, code (Splitwise: median prompt 1500, median output 13 tokens; "
          "spread ours); SLO Arrow Table 1: 3 s / 0.1 s; bursty (Arrow: c_v 0.80)",
          (3.0, 0.1), from_median(1500, 1.0), from_median(13, 1.0), burst_cv=0.8),
    _spec("azure-conv", "Azure LLM inference 2023, conversation (Splitwise: median prompt 1020, median output 129; "
          "spread ours); SLO Arrow Table 1: 2 s / 0.15 s",
          (2.0, 0.15), from_median(1020, 1.0), from_median(129, 1.0)),
    _spec("burstgpt", "BurstGPT (FairBatching Table 2: prompt mean 688 p90 1599, output mean 237 p90 470); "
          "SLO Arrow Table 1: 0.25 s / 0.075 s; bursty (Arrow: c_v 1.11)",
          (0.25, 0.075), from_mean_p90(688, 1599), from_mean_p90(237, 470), burst_cv=1.11),
    _spec("mooncake-clip", "Mooncake conversation (Mooncake FAST'25: mean prompt 12035, mean output 343; "
          "spread ours); SLO Arrow Table 1: 30 s / 0.1 s; steady (Arrow: c_v 0.16)",
          (30.0, 0.1), from_mean(12035, 1.0), from_mean(343, 1.0), max_input=131072),
    _spec("qwen-trace", "QwenTrace (FairBatching Table 2: prompt mean 892 p90 1776, output mean 377 p90 742; "
          "SLO 0.5 s / 0.05 s); ProServe priorities 2/1, 50 % each",
          (0.5, 0.05), from_mean_p90(892, 1776), from_mean_p90(377, 742), priorities=True),
    _spec("sharegpt", "ShareGPT (vLLM SOSP'23: mean input 161, mean output 338; spread ours); SLO ours "
          "(1 s / 0.1 s); Poisson (no timestamps, as ProServe); ProServe priorities 2/1, 50 % each",
          (1.0, 0.1), from_mean(161, 1.0), from_mean(338, 1.0), priorities=True),
)}

# SLO of a replayed trace by its format (the same source's synthetic workload).
TRACE_FORMAT_SLO = {"azure": "azure-conv", "burstgpt": "burstgpt", "mooncake": "mooncake-clip",
                    "qwen-bailian": "qwen-trace"}


def get_slo_workload(name: str) -> SloWorkload:
    try:
        return SLO_WORKLOADS[name]
    except KeyError:
        raise UserError(f"workload {name!r}: expected one of {', '.join(SLO_WORKLOADS)}") from None


def slo_of(name: str) -> tuple[float, float]:
    """(TTFT SLO, TPOT SLO) in seconds of workload ``name``."""
    w = get_slo_workload(name)
    return w.ttft_slo, w.tpot_slo


def _arrivals(w: SloWorkload, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if w.burst_cv <= 0:
        gaps = rng.exponential(1.0 / rate, size=n)
        return np.cumsum(gaps) - gaps[0]
    sigma = math.sqrt(math.log(1.0 + w.burst_cv ** 2))  # lognormal multiplier with mean 1 and this c_v
    times = np.empty(n)
    t, i = 0.0, 0
    while i < n:
        m = rng.lognormal(-sigma * sigma / 2.0, sigma)
        # Window duration as at the mean rate, so time and load both average to ``rate``.
        span = w.burst_window / rate
        ts = np.sort(rng.uniform(0.0, span, size=rng.poisson(w.burst_window * m)))[:n - i]
        times[i:i + len(ts)] = t + ts
        i += len(ts)
        t += span
    return times - times[0]


def generate_slo_workload(name: str, rate: float, num_requests: int, seed: int) -> list[Request]:
    """``num_requests`` requests of ``name`` at ``rate`` requests/s (cluster); deterministic per seed."""
    w = get_slo_workload(name)
    if not rate > 0:
        raise UserError(f"workload {name!r}: rate: expected a positive number of requests/s, got {rate!r}")
    if num_requests < 1:
        raise UserError(f"workload {name!r}: num_requests: expected at least 1, got {num_requests}")
    rng = np.random.default_rng([seed, 14])
    inp = np.clip(np.rint(rng.lognormal(w.input_mu, w.input_sigma, num_requests)), 1, w.max_input)
    out = np.clip(np.rint(rng.lognormal(w.output_mu, w.output_sigma, num_requests)), 1, w.max_output)
    times = _arrivals(w, rate, num_requests, np.random.default_rng([seed, 15]))
    high = np.random.default_rng([seed, 16]).random(num_requests) < 0.5
    return [Request(id=f"{name}-{i}", arrival=float(times[i]), input_tokens=int(inp[i]), output_tokens=int(out[i]),
                    category=("high" if high[i] else "low") if w.priorities else None)
            for i in range(num_requests)]


def with_priorities(requests: list[Request], seed: int) -> list[Request]:
    """A replayed trace with ProServe's seeded 50/50 high/low split (``category``)."""
    high = np.random.default_rng([seed, 16]).random(len(requests)) < 0.5
    return [replace(r, category="high" if h else "low") for r, h in zip(requests, high)]
