"""The ``mfs`` policy's own RED order (``MfsPolicy._red_sorted``, REDs looked up
by each batch's live requests and deadlines) is ``red.red_order``'s, cache hits included."""

from __future__ import annotations

import math

import numpy as np

from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.red import red_order


def test_red_sorted_is_red_order_with_ties_empty_batches_and_cache_hits():
    rng = np.random.default_rng(11)
    p = MfsPolicy()
    pool = [float(x) for x in rng.uniform(0.0, 1.0, 6)]  # few values: equal REDs and repeated deadline sets
    for trial in range(400):
        # (request indices restart at 0 each trial, which a policy never does: its request memo goes too)
        p._batch_names, p._request_deadline, p._live_requests, p._batch_red = [], [], {}, {}
        p._red_by_requests = {}
        live = []
        for b in range(int(rng.integers(1, 9))):
            p._batch_names.append(f"b{int(rng.integers(0, 1000)):03d}-{b}")
            requests = {}
            for _ in range(int(rng.integers(1, 5))):
                requests[len(p._request_deadline)] = 1
                p._request_deadline.append(math.nan if rng.random() < 0.2 else pool[int(rng.integers(0, 6))])
            p._live_requests[b] = requests
            live.append(b)
        order, _ = red_order({p._batch_names[b]: p._deadlines(b) for b in live})
        assert [p._batch_names[b] for b in p._red_sorted(live)] == order, trial
        p._batch_red.clear()  # (as when every batch left and came back with the same requests)
        assert [p._batch_names[b] for b in p._red_sorted(live)] == order, trial
    assert 0 < len(p._red_cache) < 400 * 4  # the cache was hit


def test_a_returning_batch_finds_its_red_by_its_requests():
    """A batch leaves when its layer's last flow completes and comes back with
    the next layer's flows of the same requests: its RED is looked up by those
    requests, without recomputing it from the deadlines."""
    from laxflow.policy import Flow, Stage

    p = MfsPolicy()
    flows = [Flow.on_path(f"L0.{i}", 1e6, [0], stage=Stage.REUSE, request=f"r{i}", batch="b", deadline=1.0 + i)
             for i in range(3)]
    for f in flows:
        p._enter(f)
    b = p._batch_index["b"]
    red = p._red_of(b)
    for f in flows:
        p.rmlq.slot[f] = p.rmlq.allocate(f)
        p.rmlq.facts[p.rmlq.slot[f]] = (False, 1, 0, 1e9, 1.0, b, p._live_flows[b][f], 0.0, math.nan)
        p.on_complete(f, 0.5)
    assert b not in p._live_requests and b not in p._batch_red  # gone, its RED forgotten
    p._red_cache.clear()  # (a lookup by deadlines would now recompute)
    for i in range(3):
        p._enter(Flow.on_path(f"L1.{i}", 1e6, [0], stage=Stage.REUSE, request=f"r{i}", batch="b", deadline=1.0 + i))
    assert p._red_of(b) == red
    assert not p._red_cache  # found by its requests


def test_a_flow_whose_admission_raised_can_still_complete():
    """A decide that raised mid-admission (a link outside the snapshot's capacities)
    leaves a slot without facts; its on_complete must not raise (daemons call it)."""
    import pytest

    from laxflow.policy import Flow, Snapshot, Stage

    p = MfsPolicy()
    bad = Flow.on_path("bad", 1e6, [5], stage=Stage.P2D, request="r", batch="b", deadline=1.0)
    snap = Snapshot(now=0.0, flows=[bad], remaining=np.array([1e6]), capacity=np.full(2, 1e9),
                    link_load=np.zeros(2), load_window=0.01)
    with pytest.raises(IndexError):
        p.decide(snap)
    assert p.rmlq.facts[p.rmlq.slot[bad]] is None
    p.on_complete(bad, 0.001)
    assert bad not in p.rmlq.slot
