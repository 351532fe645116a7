"""Fair Sharing's cached decisions: right values for every flow count, equal
on every call, and read-only so that no reader can change a later answer."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot
from laxflow.policy.base import BASELINE_DSCP_MAP, Decision
from laxflow.policy.dscp import default_dscp_map
from laxflow.policy.fair_sharing import FairSharing


def snapshot(n: int) -> Snapshot:
    flows = [Flow.on_path(f"f{k}", 1.0 + k, [0]) for k in range(n)]
    return Snapshot(now=0.0, flows=flows, remaining=np.array([f.size for f in flows]), capacity=np.ones(1),
                    link_load=np.zeros(1), load_window=0.01)


def check_values(d: Decision, n: int, top_dscp: int) -> None:
    assert d.level.dtype == np.int64 and d.level.tolist() == [0] * n
    assert d.queue.dtype.kind == "i" and d.queue.tolist() == [0] * n
    assert d.dscp.dtype == np.uint8 and d.dscp.tolist() == [top_dscp] * n
    assert d.cap is None and d.timers == ()


@pytest.mark.parametrize("n", [1, 3])
def test_values_for_one_and_three_flows(n):
    d = FairSharing().decide(snapshot(n))
    check_values(d, n, BASELINE_DSCP_MAP.dscp(0))


def test_two_calls_give_equal_decisions():
    fs = FairSharing()
    a, b = fs.decide(snapshot(3)), fs.decide(snapshot(3))
    for name in ("level", "queue", "dscp"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.cap == b.cap and a.timers == b.timers


def test_cached_arrays_are_read_only():
    fs = FairSharing()
    d = fs.decide(snapshot(3))
    for name in ("level", "queue", "dscp"):
        arr = getattr(d, name)
        assert not arr.flags.writeable, name
        with pytest.raises(ValueError):
            arr[0] = 5
    check_values(fs.decide(snapshot(3)), 3, BASELINE_DSCP_MAP.dscp(0))


def test_counts_beyond_the_first_allocation_and_back():
    # The shared zero arrays grow by doubling; earlier counts keep their answers.
    fs = FairSharing()
    for n in (3, 1, 200, 65, 3, 1000, 1, 0):
        check_values(fs.decide(snapshot(n)), n, BASELINE_DSCP_MAP.dscp(0))


def test_own_dscp_map_is_used():
    table = default_dscp_map(4)
    d = FairSharing(table).decide(snapshot(3))
    check_values(d, 3, table.dscp(0))
    assert table.dscp(0) != BASELINE_DSCP_MAP.dscp(0)  # the check above tells the maps apart
