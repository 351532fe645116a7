"""MFS decisions on recorded serving runs do not change.

``data/mfs_trace_*.json.gz`` hold every call the ``mfs`` policy got in two
small serving runs (``bench/policy.py --record``: the setups and how to
re-record are there) and what it answered. Replaying them into a fresh
policy must give the same levels, queues, DSCP and timers at every decision:
speed work on the policy must not move a single flow. The pruning trace runs
Algorithm 1 standalone (``drop_budget`` 2) and prunes requests. Each trace
runs through the C core (``MfsPolicy(native=True)``) and the reference
(``native=False``, :class:`~laxflow.policy.mfs.reference.Reference`); both
must also end in the same state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE
from laxflow.sim.network.trace import load, replay

DATA = Path(__file__).resolve().parent / "data"


# path -> MfsPolicy's native: the C core, and the reference.
PATHS = {"native": True, "reference": False}


def _policy(data, path):
    if PATHS[path] and not NATIVE:
        pytest.skip("laxflow.policy.mfs._core is not built")
    return MfsPolicy(**data["meta"]["mfs"], native=PATHS[path])


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
    data = load(DATA / f"{name}.json.gz")
    ref, core = _policy(data, "reference"), _policy(data, "native")
    rows = list(replay(data, ref))
    assert list(replay(data, core)) == rows
    assert core.native and not ref.native  # the C core ran, and only on one
    assert_same_state(ref, core)
    assert ref.infeasible == core.infeasible


def assert_same_state(ref: MfsPolicy, core: MfsPolicy, flows=()) -> None:
    """The two policies' states read the same through the state interface
    (tables, live batches with their REDs, pruned set, live flows' levels)."""
    a, b = ref.state, core.state
    tables = ("batches", "requests", "live_batches")  # (slots and memos grow as each implementation likes)
    assert [a.sizes()[k] for k in tables] == [b.sizes()[k] for k in tables]
    assert a.pruned_names() == b.pruned_names()
    assert repr(a.live_batches()) == repr(b.live_batches()) and sorted(map(repr, a.gone_batches())) == \
        sorted(map(repr, b.gone_batches()))
    assert repr(a.owners(flows)) == repr(b.owners(flows))
    for f in flows:
        assert (a.level(f, True), a.level(f, False)) == (b.level(f, True), b.level(f, False)), f.id
