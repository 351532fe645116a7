"""MLU thresholds and levels, RLI, and the queue/host-order arbitration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from laxflow.policy.arbitration import engine_levels, queue_of
from laxflow.policy.base import STAGE_CODES
from laxflow.policy.flow import Stage
from laxflow.policy.mlu import level_of, mlu, thresholds
from laxflow.policy.rli import rli

Q = thresholds(8, 4.0, 0.5)


def test_thresholds_are_geometric_from_U():
    assert Q == pytest.approx([0.5 * 4.0**-j for j in range(7)])


@pytest.mark.parametrize(
    "value, level",
    [(1.5, 0), (0.5, 0), (0.49, 1), (0.125, 1), (0.124, 2), (0.5 / 4**6, 6), (1e-9, 7), (0.0, 7), (np.inf, 0)],
)
def test_level_boundaries(value, level):
    assert level_of(np.array([value]), Q)[0] == level


def test_mlu_formula_and_degenerate_cases():
    m = mlu(np.array([3.0, 1.0, 1.0, 1.0]), np.array([6.0, 0.0, 1.0, -1.0]), np.array([1.0, 1.0, 2.0, 1.0]),
            np.array([0.5, 0.0, 1.0, 0.0]))  # fmt: skip
    assert m[0] == pytest.approx(3.0 / (6.0 * 1.0 * 0.5))
    assert np.isinf(m[1:]).all()  # no time left, no residual capacity, overdue


@given(
    rem=st.floats(1e-6, 1e9),
    slack=st.lists(st.floats(1e-9, 1e9), min_size=2, max_size=10),
    bw=st.floats(1e-3, 1e12),
    rho=st.floats(0.0, 0.999),
)
def test_mlu_level_never_more_urgent_with_more_slack(rem, slack, bw, rho):
    slack = np.sort(np.array(slack))
    levels = level_of(mlu(np.full(slack.size, rem), slack, np.full(slack.size, bw), np.full(slack.size, rho)), Q)
    assert np.all(np.diff(levels) >= 0)  # level 0 is most urgent
    assert levels.min() >= 0 and levels.max() <= 7


def test_rli_clips_and_collectives_are_zero():
    kinds = (Stage.REUSE, Stage.REUSE, Stage.REUSE, Stage.COLLECTIVE, Stage.REUSE, Stage.P2D)
    stage = np.array([STAGE_CODES[s] for s in kinds])
    target = np.array([5.0, 30.0, 2.0, 9.0, np.nan, 1.0])
    current = np.array([3.0, 1.0, 4.0, 1.0, 1.0, 3.0])
    # a p2d flow without deadline is not blocking even though its layer is done
    assert rli(target, current, stage, 8).tolist() == [2, 7, 0, 0, 7, 7]


def test_queue_layout_interleaves_rli_and_mlu_levels():
    urgency = np.array([0, 0, 1, 1, 6, 7, 3])
    explicit = np.array([True, False, True, False, False, False, False])
    pruned = np.array([False] * 6 + [True])
    q = queue_of(urgency, explicit, pruned, 8)
    assert q.tolist() == [0, 1, 1, 2, 7, 7, 8]
    level = engine_levels(q, explicit, urgency, np.array([0, 1, 0, 0, 0, 0, 0]), 8)
    # top explicit, RLI 0 before MLU level 1 in queue 1, then RLI 1, RLI 6 before RLI 7, scavenger last
    assert level.tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_red_rank_breaks_ties_only_among_implicit_flows():
    urgency = np.array([0, 0, 1, 1])
    explicit = np.array([False, False, True, True])
    q = queue_of(urgency, explicit, np.zeros(4, bool), 8)
    level = engine_levels(q, explicit, urgency, np.array([5, 2, 5, 2]), 8)
    assert level[1] < level[0]  # same RLI: better RED rank first
    assert level[2] == level[3]  # explicit flows of one queue share a level
