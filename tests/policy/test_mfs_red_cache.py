"""The ``mfs`` policy's own RED order (``MfsPolicy._red_sorted``, REDs looked up
by each batch's live deadlines) is ``red.red_order``'s, cache hits included."""

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
        p._batch_names, p._request_deadline, p._live_requests, p._batch_red = [], [], {}, {}
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
    assert 0 < len(p._red_cache) < 400 * 4  # the cache was hit


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
