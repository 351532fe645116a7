"""MFS decisions on recorded serving runs do not change.

``data/mfs_trace_*.json.gz`` hold every call the ``mfs`` policy got in two
small serving runs (``bench/policy.py --record``: the setups and how to
re-record are there) and what it answered. Replaying them into a fresh
policy must give the same levels, queues, DSCP and timers at every decision:
speed work on the policy must not move a single flow. The pruning trace runs
Algorithm 1 standalone (``drop_budget`` 2) and prunes requests. Each trace
runs through the C core (``laxflow.policy.mfs.core``) and the reference (the vectorized
``MfsPolicy.decide``); both must also end in bit-identical policy state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.core import NATIVE
from laxflow.sim.network.trace import load, replay

DATA = Path(__file__).resolve().parent / "data"


# path -> MfsPolicy attributes: the C core, and the reference.
PATHS = {
    "native": {"native": True},
    "reference": {"native": False},
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
def test_the_core_keeps_the_reference_state(name):
    if not NATIVE:
        pytest.skip("laxflow.policy.mfs._core is not built")
    data = load(DATA / f"{name}.json.gz")
    ref, core = _policy(data, "reference"), _policy(data, "native")
    rows = list(replay(data, ref))
    assert list(replay(data, core)) == rows
    assert core._native is not None and ref._native is None  # the C core ran, and only on one
    for attr in ("_explicit_load", "_finished_bytes", "_rank", "_pruned", "_last_t"):
        assert np.array_equal(getattr(ref, attr), getattr(core, attr)), attr
    for attr in ref.rmlq._ARRAYS:
        assert np.array_equal(getattr(ref.rmlq, attr), getattr(core.rmlq, attr), equal_nan=True), attr
    assert ref.infeasible == core.infeasible
