"""MFS decisions on recorded serving runs do not change.

``data/mfs_trace_*.json.gz`` hold every call the ``mfs`` policy got in two
small serving runs (``bench/policy.py --record``: the setups and how to
re-record are there) and what it answered. Replaying them into a fresh
policy must give the same levels, queues, DSCP and timers at every decision:
speed work on the policy must not move a single flow. The pruning trace runs
Algorithm 1 standalone (``drop_budget`` 2) and prunes requests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.network.trace import load, replay

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("name", ["mfs_trace_default", "mfs_trace_pruning"])
def test_replayed_decisions_match_the_recording(name):
    data = load(DATA / f"{name}.json.gz")
    policy = MfsPolicy(**data["meta"]["mfs"])
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
