"""Synthetic workloads calibrated to the statistics the MFS paper publishes for its traces.

Called by the serving simulator's presets (``generate(name, rate, n, seed)``)
when no trace file is given. Each workload reproduces a published mean prompt
length and prompt-reuse rate (paper §2.2, §6.2, §6.3); the tests check both on
a seeded sample.

How reuse arises (both kinds share one engine, ``_generate``):

* conversation (``qwen-conv``, ``mooncake-conv``): a session opens with a
  system prompt drawn from a Zipf-popular pool plus the user's message; each
  later turn resends the whole previous prompt, the previous answer and a new
  message, so it shares the previous turn's full blocks.
* agent (``qwen-agent``, ``mooncake-agent``): a chain opens with an agent
  template (system prompt + tool definitions) drawn from a small, strongly
  Zipf-skewed pool, so many concurrent chains share a few hot prefixes; each
  step appends the tool call and its result. A step may fan out into parallel
  requests that share its context and arrive together.

Structure is built in arrival order, independent of the rate: a session's
next request becomes ready ``gap`` arrivals later (geometric, mean
``gap_mean`` scaled to the run length, see ``effective_gap``) and ready
follow-ups are served before new sessions open.

Every run length hits the same targets: the knobs are calibrated on
``CALIBRATION_REQUESTS`` requests, where a session's follow-ups fall inside
the run; a shorter run scales the gap by ``n / CALIBRATION_REQUESTS`` (never
below one arrival), so the share of follow-ups that would land after the run
ends, the only thing that depends on the length, stays the same.
(``bench/workload_calibration.py`` checks 300, 1,500 and 20,000 requests.)
Follow-ups then come fewer arrivals after their parent in a short run, so
more of them reach a prefill unit before the parent's KV is stored, and a
simulation realizes less of the reuse than the workload offers: the
serving metrics report the realized ``reuse_share`` beside it. Arrivals are then
timed as a Poisson process with ``rate`` requests/s over the whole cluster
(fan-out siblings share their group's arrival time). Same seed, same
workload, at any rate. Like replaying a real trace faster, a higher rate
shortens the time between a turn and its follow-up (``gap_mean / rate``
seconds on average): at high rates a follow-up can arrive before its parent's
KV is stored, and then reuses less than the statistic below counts.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace
from itertools import count

import numpy as np

from laxflow.errors import UserError
from laxflow.sim.workload.request import Request


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """A synthetic workload: its calibration targets and the knobs that hit them.

    Lengths are lognormal with the given mean (tokens) and log-space sigma.
    """

    name: str
    kind: str  # "conversation" or "agent"
    target_mean_input: float  # published mean prompt length, tokens
    target_reuse: float  # published prompt reuse rate (prefix_reuse_fraction)
    source: str
    block_size: int
    prefixes: int  # system prompts / agent templates in the pool
    prefix_zipf: float  # popularity exponent of the pool
    prefix_mean: float
    prefix_sigma: float = 0.5
    first_mean: float  # a session's own first text (user message / task)
    first_sigma: float = 1.0
    followup_mean: float  # new text of each later request (user turn / tool result)
    followup_sigma: float = 1.0
    output_mean: float
    output_sigma: float = 0.8
    turns_mean: float  # requests per session or chain, geometric >= 1
    gap_mean: float  # arrivals until a session's follow-up is ready
    fanout_prob: float = 0.0  # agent: chance a step issues parallel requests
    fanout_max: int = 1  # agent: most parallel requests of one step
    max_input: int  # a session ends rather than grow past this prompt length


# Knob values were tuned with bench/workload_calibration.py --tune (seed 0,
# 10,000 requests) and rounded; the script without --tune prints what they
# give, and tests/sim/workload checks the targets on other seeds.
WORKLOADS: dict[str, WorkloadSpec] = {
    s.name: s
    for s in (
        WorkloadSpec(
            name="qwen-conv", kind="conversation", target_mean_input=2000, target_reuse=0.50,
            source="MFS §6.2 QwenA-Conv (Qwen-Bailian traceA): mean ~2k tokens, 50 % prompt reuse",
            block_size=16, prefixes=64, prefix_zipf=1.0, prefix_mean=340, first_mean=1010,
            followup_mean=560, output_mean=390, turns_mean=1.73, gap_mean=500, max_input=32768),
        WorkloadSpec(
            name="qwen-agent", kind="agent", target_mean_input=1000, target_reuse=0.65,
            source="MFS §2.2/§6.2 QwenB-Agent (Qwen-Bailian traceB): mean ~1k tokens, 65 % prompt reuse, "
            "many concurrent requests sharing hot prefixes",
            block_size=16, prefixes=16, prefix_zipf=1.3, prefix_mean=265, first_mean=530,
            followup_mean=265, output_mean=95, turns_mean=1.44, gap_mean=50, fanout_prob=0.3,
            fanout_max=4, max_input=32768),
        WorkloadSpec(
            name="mooncake-conv", kind="conversation", target_mean_input=15000, target_reuse=0.40,
            source="MFS §6.3 Mooncake conversation: mean ~15k tokens, ~40 % reuse",
            block_size=512, prefixes=64, prefix_zipf=1.0, prefix_mean=1860, first_mean=11150,
            followup_mean=3720, output_mean=500, turns_mean=1.53, gap_mean=500, max_input=131072),
        WorkloadSpec(
            name="mooncake-agent", kind="agent", target_mean_input=9000, target_reuse=0.65,
            source="MFS §6.3 Mooncake tool&agent: mean ~9k tokens, ~65 % reuse",
            block_size=512, prefixes=16, prefix_zipf=1.3, prefix_mean=2680, first_mean=4820,
            followup_mean=2140, output_mean=375, turns_mean=1.44, gap_mean=50, fanout_prob=0.3,
            fanout_max=4, max_input=131072),
    )
}


# Run length the knobs were tuned on; shorter runs scale their gaps to it.
CALIBRATION_REQUESTS = 20_000


def effective_gap(spec: WorkloadSpec, num_requests: int) -> float:
    """Mean follow-up gap (in arrivals) of a run of ``num_requests`` requests."""
    return max(1.0, spec.gap_mean * min(1.0, num_requests / CALIBRATION_REQUESTS))


@dataclass
class _Context:
    """A prompt under construction: its block hashes and its length."""

    hashes: tuple[int, ...]
    tokens: int


@dataclass
class _Session:
    id: str
    context: _Context
    last_request: str
    last_output: int
    turns_left: int


class _Builder:
    """Draws lengths and mints block hashes for one ``generate`` call."""

    def __init__(self, spec: WorkloadSpec, rng: np.random.Generator) -> None:
        self.spec, self.rng = spec, rng
        self._next_hash = count()

    def length(self, mean: float, sigma: float) -> int:
        mu = math.log(mean) - sigma * sigma / 2  # lognormal with this mean
        return max(1, int(round(self.rng.lognormal(mu, sigma))))

    def extend(self, ctx: _Context, tokens: int) -> _Context:
        """``ctx`` followed by ``tokens`` new tokens: full blocks kept, the rest hashed afresh."""
        bs = self.spec.block_size
        kept = ctx.tokens // bs
        total = ctx.tokens + tokens
        fresh = math.ceil(total / bs) - kept
        return _Context(ctx.hashes[:kept] + tuple(next(self._next_hash) for _ in range(fresh)), total)


def _generate(spec: WorkloadSpec, num_requests: int, seed: int) -> list[tuple[Request, int]]:
    """Requests with arrival 0 and, for each, the index of its arrival group."""
    rng = np.random.default_rng(seed)
    b = _Builder(spec, rng)
    weights = 1.0 / np.arange(1, spec.prefixes + 1) ** spec.prefix_zipf
    weights /= weights.sum()
    # A small pool's few hot prefixes would make the workload's mean swing with
    # the seed: rescale so the popularity-weighted mean is exactly prefix_mean.
    drawn = np.array([b.length(spec.prefix_mean, spec.prefix_sigma) for _ in range(spec.prefixes)], float)
    drawn *= spec.prefix_mean / float(weights @ drawn)
    pool = [b.extend(_Context((), 0), max(1, int(round(n)))) for n in drawn]
    waiting: list[tuple[int, int, _Session]] = []  # (ready at arrival index, tiebreak, session)
    ready: deque[_Session] = deque()
    tiebreak, sessions = count(), count()
    gap_mean = effective_gap(spec, num_requests)
    out: list[tuple[Request, int]] = []
    group = 0
    while len(out) < num_requests:
        i = len(out)
        while waiting and waiting[0][0] <= i:
            ready.append(heapq.heappop(waiting)[2])
        ctx = None
        while ready and ctx is None:
            s = ready.popleft()
            nxt = b.extend(s.context, s.last_output + b.length(spec.followup_mean, spec.followup_sigma))
            if nxt.tokens <= spec.max_input:
                ctx = nxt
        if ctx is None:
            prefix = pool[int(rng.choice(spec.prefixes, p=weights))]
            first_len = b.length(spec.first_mean, spec.first_sigma)
            for _ in range(1000):  # truncate the tail by redrawing
                if prefix.tokens + first_len <= spec.max_input:
                    break
                first_len = b.length(spec.first_mean, spec.first_sigma)
            else:
                raise UserError(f"workload {spec.name!r}: max_input ({spec.max_input}) leaves no room "
                                f"after a {prefix.tokens}-token prefix")
            ctx = b.extend(prefix, first_len)
            s = _Session(id=f"{spec.name}-s{next(sessions)}", context=ctx, last_request="", last_output=0,
                         turns_left=int(rng.geometric(1.0 / spec.turns_mean)))
        fan = 1
        if spec.fanout_max > 1 and rng.random() < spec.fanout_prob:
            fan = int(rng.integers(2, spec.fanout_max + 1))
        first: Request | None = None
        for k in range(min(fan, num_requests - i)):
            # Siblings share the step's context and differ from the first token after it.
            own = ctx if k == 0 else b.extend(ctx, b.length(spec.followup_mean / 4, 0.5))
            if own.tokens > spec.max_input:
                break
            r = Request(id=f"{spec.name}-{len(out)}", arrival=0.0, input_tokens=own.tokens,
                        output_tokens=b.length(spec.output_mean, spec.output_sigma),
                        block_hashes=own.hashes, block_size=spec.block_size, session=s.id,
                        parent=s.last_request or None)
            out.append((r, group))
            first = first or r
        group += 1
        assert first is not None
        s.context, s.last_request, s.last_output = ctx, first.id, first.output_tokens
        s.turns_left -= 1
        if s.turns_left > 0:
            gap = int(rng.geometric(1.0 / gap_mean))
            heapq.heappush(waiting, (len(out) + gap - 1, next(tiebreak), s))
    return out


def generate(name: str, rate: float, num_requests: int, seed: int, prompt_scale: float = 1.0) -> list[Request]:
    """``num_requests`` requests of workload ``name`` arriving at ``rate`` requests/s (whole cluster).

    Deterministic for ``(name, num_requests, seed, prompt_scale)``; ``rate`` only scales time.
    ``prompt_scale`` (``laxflow sim map --prompt-scales``; calibrated ``WORKLOADS`` only) multiplies
    every prompt length knob (shared prefixes, first and follow-up text, the cap ``max_input``), so
    mean prompt length scales by about that much and the reuse structure (which blocks are shared,
    the turn and fan-out process) stays the workload's; outputs are unchanged.
    """
    if not (isinstance(prompt_scale, (int, float)) and prompt_scale > 0 and math.isfinite(prompt_scale)):
        raise UserError(f"workload {name!r}: prompt_scale: expected a positive number, got {prompt_scale!r}")
    if prompt_scale != 1.0 and name not in WORKLOADS:
        raise UserError(f"workload {name!r}: prompt_scale: only the calibrated workloads scale their prompts "
                        f"({', '.join(WORKLOADS)}), got {prompt_scale!r}")
    if name == "qwen-multislo":
        from laxflow.sim.workload.multislo import generate_multislo

        return generate_multislo(rate, num_requests, seed)
    from laxflow.sim.workload.slo_traces import SLO_WORKLOADS, generate_slo_workload

    if name in SLO_WORKLOADS:
        return generate_slo_workload(name, rate, num_requests, seed)
    try:
        spec = WORKLOADS[name]
    except KeyError:
        raise UserError(f"workload {name!r}: expected one of {', '.join(WORKLOADS)}") from None
    if not rate > 0:
        raise UserError(f"workload {name!r}: rate: expected a positive number of requests/s, got {rate!r}")
    if num_requests < 1:
        raise UserError(f"workload {name!r}: num_requests: expected at least 1, got {num_requests}")
    if prompt_scale != 1.0:
        spec = replace(spec, prefix_mean=spec.prefix_mean * prompt_scale, first_mean=spec.first_mean * prompt_scale,
                       followup_mean=spec.followup_mean * prompt_scale,
                       max_input=max(1, int(round(spec.max_input * prompt_scale))))
    built = _generate(spec, num_requests, seed)
    groups = built[-1][1] + 1
    # Group arrivals are Poisson at rate * groups / requests, so requests arrive at ``rate``.
    gaps = np.random.default_rng([seed, 1]).exponential(num_requests / (rate * groups), size=groups)
    times = np.cumsum(gaps) - gaps[0]
    return [replace(r, arrival=float(times[g])) for r, g in built]
