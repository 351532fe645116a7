"""RED: the split at the largest gap, the formula, its bounds, the order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from laxflow.policy.red import red_many, red_order, robust_effective_deadline

deadlines = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=30)


def test_one_request_batch_is_its_deadline():
    r = robust_effective_deadline([4.5])
    assert (r.red, r.k_star, r.loose_min) == (4.5, 1, 4.5)


def test_split_at_largest_gap_and_formula():
    # sorted 1, 10, 10, 10: the gap 1 -> 10 splits one tight from three loose
    r = robust_effective_deadline([10.0, 1.0, 10.0, 10.0])
    assert r.k_star == 1 and r.loose_min == 10.0
    assert r.red == pytest.approx(0.25 * 1.0 + 0.75 * 10.0)


def test_first_k_wins_equal_gaps():
    # gaps 1 and 1: k* = 1 (the first), f = 1/3
    r = robust_effective_deadline([1.0, 2.0, 3.0])
    assert r.k_star == 1 and r.loose_min == 2.0
    assert r.red == pytest.approx(1 / 3 * 1.0 + 2 / 3 * 2.0)


def test_piggyback_outlier_does_not_pull_loose_batch_ahead():
    order, results = red_order({"mixed": [1.0, 10.0, 10.0, 10.0], "urgent": [3.0, 3.2]})
    assert order == ["urgent", "mixed"]
    assert results["urgent"].red == pytest.approx(3.1)


def test_order_ties_by_batch_id_and_no_deadline_last():
    order, _ = red_order({"b": [2.0], "a": [2.0], "none": []})
    assert order == ["a", "b", "none"]


@given(deadlines)
def test_red_between_first_deadline_and_loose_minimum(d):
    r = robust_effective_deadline(d)
    assert min(d) <= r.red <= r.loose_min
    assert 1 <= r.k_star <= len(d)
    # the loose minimum is a deadline of the batch, at least as late as d_1
    assert r.loose_min in d and r.loose_min >= min(d)


@given(deadlines)
def test_red_ignores_request_order(d):
    assert robust_effective_deadline(d) == robust_effective_deadline(list(reversed(d)))


@given(st.lists(st.lists(st.integers(-50, 50), min_size=1, max_size=8), min_size=1, max_size=8), st.randoms())
def test_vectorized_red_matches_the_scalar_one(batches, rnd):
    pairs = [(b, float(d)) for b, ds in enumerate(batches) for d in ds]
    rnd.shuffle(pairs)
    red, loose = red_many(np.array([b for b, _ in pairs]), np.array([d for _, d in pairs]), len(batches))
    for b, ds in enumerate(batches):
        r = robust_effective_deadline(ds)
        assert (red[b], loose[b]) == (r.red, r.loose_min)
