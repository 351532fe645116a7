"""MFS decisions on recorded serving runs do not change.

``data/mfs_trace_*.json.gz`` hold every call the ``mfs`` policy got in two
small serving runs (``bench/policy.py --record``: the setups and how to
re-record are there) and what it answered. Replaying them into a fresh
policy must give the same levels, queues, DSCP and timers at every decision:
speed work on the policy must not move a single flow. The pruning trace runs
Algorithm 1 standalone (``drop_budget`` 2) and prunes requests. Each trace
runs through the incremental path (``mfs_incremental``, the default), the
scalar from-scratch path (``mfs_scalar``) and the vectorized one alone; all
must also end in bit-identical policy state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.network.trace import load, replay

DATA = Path(__file__).resolve().parent / "data"


# path -> MfsPolicy attributes: the default (scalar for few flows, incremental
# above), the incremental path alone, and the two from-scratch paths alone.
PATHS = {
    "native": {"native": True},
    "default": {"native": False},
    "incremental": {"native": False, "incremental_from": 0, "incremental_below": 0, "incremental_upto": 10**9},
    "scalar": {"native": False, "incremental": False},
    "vectorized": {"native": False, "incremental": False, "few_flows": 0},
}


def _policy(data, path):
    policy = MfsPolicy(**data["meta"]["mfs"])
    for attr, value in PATHS[path].items():
        setattr(policy, attr, value)
    return policy


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", ["mfs_trace_default", "mfs_trace_pruning"])
def test_replayed_decisions_match_the_recording(name, path):
    data = load(DATA / f"{name}.json.gz")
    policy = _policy(data, path)
    count = 0
    for k, (recorded, replayed) in enumerate(replay(data, policy)):
        if replayed != recorded:
            fields = ("level", "queue", "dscp", "cap", "timers")
            diff = [f for f, a, b in zip(fields, recorded, replayed) if a != b]
            pytest.fail(f"{name}: decision #{k} differs in {diff}: recorded {recorded}, replayed {replayed}")
        count += 1
    assert count > 1000
    if data["meta"]["mfs"].get("drop_budget"):
        assert policy.pruned_requests, "the pruning trace must exercise Algorithm 1's pruning"


@pytest.mark.parametrize("name", ["mfs_trace_default", "mfs_trace_pruning"])
@pytest.mark.parametrize("other", ["vectorized", "incremental", "default", "native"])
def test_every_path_keeps_the_same_state(name, other):
    data = load(DATA / f"{name}.json.gz")
    scalar, vector = _policy(data, "scalar"), _policy(data, other)
    rows = list(replay(data, scalar))
    assert list(replay(data, vector)) == rows
    assert sum(len(level) <= scalar.few_flows for _, (level, *_) in rows) > 500  # the scalar path did run
    for attr in ("_explicit_load", "_finished_bytes", "_rank", "_pruned", "_last_t"):
        assert np.array_equal(getattr(scalar, attr), getattr(vector, attr)), attr
    for attr in scalar.rmlq._ARRAYS:
        assert np.array_equal(getattr(scalar.rmlq, attr), getattr(vector.rmlq, attr), equal_nan=True), attr
    assert scalar.infeasible == vector.infeasible
