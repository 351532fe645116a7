"""The ``mfs`` policy's RED ranks across batches that leave and come back.

A batch leaves the live set when its last flow completes and comes back with
its next layer's flows. The policy ranks the live batches together with the
ones that left (as they were), so a batch that comes back with the RED it
left with keeps its place and a reorder writes nothing
(``MfsPolicy._ranks_hold``). Whatever happened, after every reorder the live
batches' ranks must order them exactly as a from-scratch sort does
(``_red_sorted``: ``red.red_order``'s order), and the reorder must say
whether a live batch's rank moved.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy

LINKS = 4


def _snapshot(now: float, flows: list[Flow]) -> Snapshot:
    return Snapshot(now=now, flows=list(flows), remaining=np.array([f.size for f in flows]),
                    capacity=np.full(LINKS, 1e9), link_load=np.zeros(LINKS), load_window=0.01)


@pytest.mark.parametrize("native", [True, False])
def test_live_ranks_follow_a_fresh_red_sort_through_departures_returns_and_ties(native: bool):
    rng = np.random.default_rng(5)
    p = MfsPolicy()
    p.native = native and p.native
    # Few deadline values: equal REDs (ties broken by name) and repeated deadline
    # sets; now and then two infinite deadlines in a batch, whose RED is NaN.
    pool = [0.2, 0.4, 0.4000001, 0.9, math.inf]
    live: list[Flow] = []
    deadlines: dict[str, float] = {}
    now, seq, checked, held, moved_seen = 0.0, 0, 0, 0, set()
    for step in range(4000):
        now += 1e-4
        if live and rng.random() < 0.45:  # a departure (of one flow; its batch goes when its last one does)
            p.on_complete(live.pop(int(rng.integers(0, len(live)))), now)
        else:  # an arrival: in a batch that may be live, gone, or new
            b = f"b{int(rng.integers(0, 12)):02d}"
            r = f"{b}-r{int(rng.integers(0, 4))}"
            d = deadlines.setdefault(r, pool[int(rng.integers(0, len(pool)))] if rng.random() < 0.95 else math.inf)
            seq += 1
            stage = (Stage.REUSE, Stage.COLLECTIVE, Stage.P2D)[int(rng.integers(0, 3))]
            live.append(Flow.on_path(f"f{seq}", 1e6, [int(rng.integers(0, LINKS))], stage=stage, request=r,
                                     batch=b, deadline=d, layer=1, current_layer=0))
        if live:
            p.decide(_snapshot(now, live))  # admits the new flows, reorders when the order is stale
        if rng.random() < 0.3:  # a reorder now, stale or not
            batches = list(p._live_flows)
            before = {b: int(p._rank[b]) for b in batches}
            # (before the reorder, which may rebuild _ranked_red): every batch that came or changed
            # since the last full reorder is gone again or back with the RED it was ranked by
            holds = all(b not in p._live_flows or p._ranked_red.get(b) == p._red_of(b) for b in p._touched)
            moved = p._reorder(lambda: None)
            ranks = [int(p._rank[b]) for b in batches]
            if holds:  # then the reorder writes nothing
                held += 1
                assert not moved and ranks == [before[b] for b in batches], step
            assert len(set(ranks)) == len(ranks), step  # distinct: strictly ordered
            if not any(math.isnan(p._red_of(b)) for b in batches):
                assert sorted(batches, key=lambda b: int(p._rank[b])) == p._red_sorted(batches), step
                checked += 1
            assert moved == any(before[b] != int(p._rank[b]) for b in batches), step
            moved_seen.add(moved)
    assert checked > 800 and held > 100 and moved_seen == {True, False}


def test_a_batch_back_with_its_red_keeps_its_place_after_others_were_ranked():
    """A leaves, C arrives (a full reorder while A is away), A comes back with
    the same deadlines: its place was kept, so nothing is re-ranked."""
    p = MfsPolicy()
    flows = {name: Flow.on_path(name, 1e6, [0], stage=Stage.REUSE, request=f"{name}-r", batch=name,
                                deadline=d, layer=1, current_layer=0)
             for name, d in (("A", 0.1), ("B", 0.2), ("C", 0.3))}
    p.decide(_snapshot(0.0, [flows["A"], flows["B"]]))
    p.on_complete(flows["A"], 0.001)  # A's layer is done: it leaves
    p.decide(_snapshot(0.001, [flows["B"], flows["C"]]))  # C is new: a full reorder
    rank_b, rank_c = int(p._rank[p._batch_index["B"]]), int(p._rank[p._batch_index["C"]])
    again = Flow.on_path("A2", 1e6, [0], stage=Stage.REUSE, request="A-r", batch="A", deadline=0.1, layer=2,
                         current_layer=1)
    p.decide(_snapshot(0.002, [flows["B"], flows["C"], again]))
    assert not p._order_stale and not p._touched  # the reorder ran, and held
    ranks = [int(p._rank[p._batch_index[b]]) for b in "ABC"]
    assert ranks == sorted(ranks) and ranks[1:] == [rank_b, rank_c]  # A first again, B and C untouched
    assert p._ranked_red[p._batch_index["A"]] == 0.1
