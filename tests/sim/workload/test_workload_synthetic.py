"""Synthetic workloads: calibration targets, determinism, Poisson timing, how reuse is built."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from laxflow.errors import UserError
from laxflow.sim.workload import WORKLOADS, generate, mean_input_tokens, prefix_reuse_fraction

N = 10000


@pytest.fixture(scope="module")
def samples() -> dict:
    # Seed 7 is not the seed the knobs were tuned on.
    return {name: generate(name, 32.0, N, seed=7) for name in WORKLOADS}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_mean_length_and_reuse_hit_the_published_targets(samples: dict, name: str) -> None:
    spec, reqs = WORKLOADS[name], samples[name]
    assert len(reqs) == N
    assert mean_input_tokens(reqs) == pytest.approx(spec.target_mean_input, rel=0.08)
    assert prefix_reuse_fraction(reqs) == pytest.approx(spec.target_reuse, abs=0.04)


def test_targets_are_the_papers() -> None:
    got = {n: (s.target_mean_input, s.target_reuse, s.block_size) for n, s in WORKLOADS.items()}
    assert got == {"qwen-conv": (2000, 0.50, 16), "qwen-agent": (1000, 0.65, 16),
                   "mooncake-conv": (15000, 0.40, 512), "mooncake-agent": (9000, 0.65, 512)}


def test_same_seed_same_workload_and_rate_only_scales_time() -> None:
    a = generate("qwen-agent", 8.0, 500, seed=3)
    assert a == generate("qwen-agent", 8.0, 500, seed=3)
    b = generate("qwen-agent", 16.0, 500, seed=3)
    assert [r.arrival / 2 for r in a] == pytest.approx([r.arrival for r in b])
    assert [(r.input_tokens, r.block_hashes) for r in a] == [(r.input_tokens, r.block_hashes) for r in b]
    c = generate("qwen-agent", 8.0, 500, seed=4)
    assert [r.input_tokens for r in a] != [r.input_tokens for r in c]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_poisson_arrivals_at_the_cluster_rate(samples: dict, name: str) -> None:
    t = np.array([r.arrival for r in samples[name]])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(32.0, rel=0.06)
    if WORKLOADS[name].fanout_max == 1:
        gaps = np.diff(t)
        assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_hashes_cover_the_prompt_and_ids_are_unique(samples: dict, name: str) -> None:
    reqs = samples[name]
    assert len({r.id for r in reqs}) == len(reqs)
    for r in reqs:
        assert len(r.block_hashes) == math.ceil(r.input_tokens / r.block_size)
        assert r.block_size == WORKLOADS[name].block_size
        assert r.input_tokens <= WORKLOADS[name].max_input and r.output_tokens >= 1


@pytest.mark.parametrize("name", ["qwen-conv", "mooncake-conv"])
def test_a_turn_resends_its_parent_and_arrives_after_it(samples: dict, name: str) -> None:
    reqs = samples[name]
    by_id = {r.id: r for r in reqs}
    follow = [r for r in reqs if r.parent]
    assert len(follow) > 0.2 * len(reqs)
    for r in follow:
        p = by_id[r.parent]
        kept = p.input_tokens // p.block_size
        assert r.block_hashes[:kept] == p.block_hashes[:kept]
        assert r.input_tokens >= p.input_tokens + p.output_tokens
        assert r.arrival > p.arrival and r.session == p.session


@pytest.mark.parametrize("name", ["qwen-agent", "mooncake-agent"])
def test_agents_share_hot_prefixes_and_fan_out_together(samples: dict, name: str) -> None:
    reqs = samples[name]
    first_block = Counter(r.block_hashes[0] for r in reqs)
    hottest = first_block.most_common(1)[0][1]
    assert hottest > 0.2 * len(reqs)  # one template opens a fifth of all prompts
    # Fan-out: several requests of one session arriving at the same instant.
    together = Counter((r.session, r.arrival) for r in reqs)
    assert sum(1 for c in together.values() if c > 1) > 0.1 * len(together)


def test_bad_arguments() -> None:
    with pytest.raises(UserError, match="workload 'chat': expected one of qwen-conv"):
        generate("chat", 1.0, 10, 0)
    with pytest.raises(UserError, match="rate"):
        generate("qwen-conv", 0.0, 10, 0)
    with pytest.raises(UserError, match="num_requests"):
        generate("qwen-conv", 1.0, 0, 0)


def test_short_runs_hit_the_same_targets_as_long_ones():
    """A 400-request run scales the follow-up gap, so its turns fall inside it (issue 11: 1,436 tokens and
    0.30 reuse before, against 2,000 and 0.50); averaged over seeds, since 400 lognormal lengths are noisy."""
    from laxflow.sim.workload import summarize
    from laxflow.sim.workload.synthetic import WORKLOADS, effective_gap

    spec = WORKLOADS["qwen-conv"]
    assert effective_gap(spec, 400) == pytest.approx(10.0)
    assert effective_gap(spec, 20_000) == effective_gap(spec, 10**6) == spec.gap_mean
    runs = [summarize(generate("qwen-conv", 1.0, 400, seed)) for seed in range(10)]
    mean = sum(r["mean_input_tokens"] for r in runs) / len(runs)
    reuse = sum(r["prefix_reuse_fraction"] for r in runs) / len(runs)
    assert mean == pytest.approx(spec.target_mean_input, rel=0.07)
    assert reuse == pytest.approx(spec.target_reuse, abs=0.05)
