"""A request as the serving simulator sees it, and statistics over a list of them.

Requests come from ``synthetic.generate`` or ``traces.load_trace`` and are
read by the serving simulator's router (which unit holds a request's reusable
KV is decided by its block hashes) and by the tests and docs (reuse fraction).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt arriving at the cluster.

    ``block_hashes[i]`` names the KV of tokens ``[i * block_size, (i + 1) *
    block_size)`` of the prompt, together with everything before them (hashes
    are prefix-chained, as in vLLM/SGLang prefix caches and in the Qwen and
    Mooncake traces): two requests share the KV of a block exactly when they
    share its hash. The last block may be partial. A request without hashes
    shares nothing.
    """

    id: str
    arrival: float  # s since the start of the workload
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()
    block_size: int = 16  # tokens per hash block
    session: str | None = None  # conversation / agent chain this request belongs to
    parent: str | None = None  # the request this one continues (previous turn or step)
    category: str | None = None  # task type with its own TTFT SLO (qwen-multislo: text, image, search, file)

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.input_tokens / self.block_size)

    def block_tokens(self, i: int) -> int:
        """Prompt tokens covered by block ``i`` (the last one may be partial)."""
        return max(0, min(self.block_size, self.input_tokens - i * self.block_size))


def _in_arrival_order(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: r.arrival)  # stable: ties keep list order


def prefix_reuse_fraction(requests: Sequence[Request]) -> float:
    """Fraction of all input tokens a prefix cache of unbounded size would reuse.

    Requests are taken in arrival order; a request reuses the tokens of its
    leading blocks whose hashes appeared in an earlier request, up to the first
    block that did not (KV reuse is by prefix). This is the "prompt reuse rate"
    the MFS paper quotes for its workloads (50 % QwenA-Conv, 65 % QwenB-Agent...).
    """
    seen: set[int] = set()
    reused = total = 0
    for r in _in_arrival_order(requests):
        total += r.input_tokens
        for i, h in enumerate(r.block_hashes):
            if h not in seen:
                break
            reused += r.block_tokens(i)
        seen.update(r.block_hashes)
    return reused / total if total else 0.0


def mean_input_tokens(requests: Sequence[Request]) -> float:
    return float(np.mean([r.input_tokens for r in requests])) if requests else 0.0


def summarize(requests: Sequence[Request]) -> dict[str, float]:
    """The numbers a workload is calibrated on, plus a few for reports."""
    if not requests:
        return {"requests": 0}
    arr = np.array([r.arrival for r in requests])
    inp = np.array([r.input_tokens for r in requests])
    span = float(arr.max() - arr.min())
    return {
        "requests": len(requests),
        "mean_input_tokens": float(inp.mean()),
        "p50_input_tokens": float(np.percentile(inp, 50)),
        "p99_input_tokens": float(np.percentile(inp, 99)),
        "mean_output_tokens": float(np.mean([r.output_tokens for r in requests])),
        "prefix_reuse_fraction": prefix_reuse_fraction(requests),
        "duration_s": span,
        "rate_per_s": (len(requests) - 1) / span if span > 0 else float("inf"),
    }


def with_poisson_arrivals(requests: Iterable[Request], rate: float, seed: int) -> list[Request]:
    """The same requests, in the same order, re-timed as a Poisson process of ``rate`` req/s.

    For sweeping load over a real trace: content and reuse structure are kept,
    only the arrival times change.
    """
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    reqs = _in_arrival_order(list(requests))
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=len(reqs))
    times = np.cumsum(gaps) - (gaps[0] if len(reqs) else 0.0)
    return [replace(r, arrival=float(t)) for r, t in zip(reqs, times)]
