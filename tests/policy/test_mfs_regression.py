"""MFS decisions on recorded serving runs do not change.

``data/mfs_trace_*.json.gz`` hold every call the ``mfs`` policy got in two
small serving runs (``bench/policy.py --record``: the setups and how to
re-record are there) and what it answered. Replaying them into a fresh
policy must give the same levels, queues, DSCP and timers at every decision:
speed work on the policy must not move a single flow. The pruning trace runs
Algorithm 1 standalone (``drop_budget`` 2) and prunes requests. Each trace
runs through the scalar few-flow path (``mfs_scalar``, the default for small
snapshots) and through the vectorized path alone; both must also end in
bit-identical policy state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.network.trace import load, replay

DATA = Path(__file__).resolve().parent / "data"


PATHS = {"default": None, "vectorized": 0}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", ["mfs_trace_default", "mfs_trace_pruning"])
def test_replayed_decisions_match_the_recording(name, path):
    data = load(DATA / f"{name}.json.gz")
    policy = MfsPolicy(**data["meta"]["mfs"])
    if PATHS[path] is not None:
        policy.few_flows = PATHS[path]
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
def test_scalar_and_vectorized_paths_keep_the_same_state(name):
    data = load(DATA / f"{name}.json.gz")
    scalar, vector = MfsPolicy(**data["meta"]["mfs"]), MfsPolicy(**data["meta"]["mfs"])
    vector.few_flows = 0
    rows = list(replay(data, scalar))
    assert list(replay(data, vector)) == rows
    assert sum(len(level) <= scalar.few_flows for _, (level, *_) in rows) > 500  # the scalar path did run
    for attr in ("_explicit_load", "_finished_bytes", "_rank", "_pruned"):
        assert np.array_equal(getattr(scalar, attr), getattr(vector, attr)), attr
    for attr in scalar.rmlq._ARRAYS:
        assert np.array_equal(getattr(scalar.rmlq, attr), getattr(vector.rmlq, attr), equal_nan=True), attr
    assert scalar.infeasible == vector.infeasible
