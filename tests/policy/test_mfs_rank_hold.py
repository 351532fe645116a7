"""The ``mfs`` policy's RED ranks across batches that leave and come back.

A batch leaves the live set when its last flow completes and comes back with
its next layer's flows. The policy ranks the live batches together with the
ones that left (as they were), so a batch that comes back with the RED it
left with keeps its place and the state skips the reorder (its rank hold).
Whatever happened, after every decision the live batches' ranks must order
them exactly as a from-scratch sort does (``red.red_order``'s order), and
``set_ranks`` must say whether a live batch's rank moved.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE

LINKS = 4


def _snapshot(now: float, flows: list[Flow]) -> Snapshot:
    return Snapshot(now=now, flows=list(flows), remaining=np.array([f.size for f in flows]),
                    capacity=np.full(LINKS, 1e9), link_load=np.zeros(LINKS), load_window=0.01)


class Counting(MfsPolicy):
    """mfs, counting the full reorders its state asks for."""

    reorders = 0

    def _reorder(self, snap):
        self.reorders += 1
        super()._reorder(snap)


def _batch_order(p: MfsPolicy, snap: Snapshot) -> list[str]:
    """The live batches in the order the decision ranks them: every flow has
    the same RMLQ level (reuse, one layer ahead), so levels follow the ranks."""
    level = p.decide(snap).level
    first = {}
    for f, lv in zip(snap.flows, level.tolist()):
        assert first.setdefault(f.batch, lv) == lv  # one level per batch: ranks are distinct
    return sorted(first, key=first.get)


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.skipif(
    not NATIVE, reason="laxflow.policy.mfs._core is not built")), False])
def test_live_ranks_follow_a_fresh_red_sort_through_departures_returns_and_ties(native: bool):
    rng = np.random.default_rng(5)
    p = Counting(native=native)
    # Few deadline values: equal REDs (ties broken by name) and repeated deadline
    # sets; now and then two infinite deadlines in a batch, whose RED is NaN.
    pool = [0.2, 0.4, 0.4000001, 0.9, math.inf]
    live: list[Flow] = []
    deadlines: dict[str, float] = {}
    now, seq, checked, held = 0.0, 0, 0, 0
    for step in range(4000):
        now += 1e-4
        if live and rng.random() < 0.45:  # a departure (of one flow; its batch goes when its last one does)
            p.on_complete(live.pop(int(rng.integers(0, len(live)))), now)
        else:  # an arrival: in a batch that may be live, gone, or new
            b = f"b{int(rng.integers(0, 12)):02d}"
            r = f"{b}-r{int(rng.integers(0, 4))}"
            d = deadlines.setdefault(r, pool[int(rng.integers(0, len(pool)))] if rng.random() < 0.95 else math.inf)
            seq += 1
            live.append(Flow.on_path(f"f{seq}", 1e6, [int(rng.integers(0, LINKS))], stage=Stage.REUSE, request=r,
                                     batch=b, deadline=d, layer=1, current_layer=0))
        if not live:
            continue
        snap = _snapshot(now, live)
        was_live = {name for _, name, _ in p.state.live_batches()}
        before = p.reorders
        order = _batch_order(p, snap)  # admits; reorders when the order is stale, unless the ranks hold
        # A batch became live: the order was stale. No reorder: the ranks held.
        holds = p.reorders == before and not {f.batch for f in live} <= was_live
        if rng.random() < 0.3 or holds:  # a full reorder now: the ranks as they should be
            p._reorder(snap)
            full = _batch_order(p, snap)
            if holds:  # then the kept ranks already ordered the batches so
                held += 1
                assert order == full, step
            keyed = p.state.live_batches()
            if not any(math.isnan(red) for red, _, _ in keyed):
                assert full == [name for _, name, _ in sorted(keyed)], step
                checked += 1
    assert checked > 800 and held > 5 and p.reorders > 100


def test_set_ranks_says_whether_a_live_batch_moved():
    p = MfsPolicy(native=False)
    flows = [Flow.on_path(n, 1e6, [0], stage=Stage.REUSE, request=f"{n}-r", batch=n, deadline=d, layer=1,
                          current_layer=0) for n, d in (("A", 0.1), ("B", 0.2))]
    p.decide(_snapshot(0.0, flows))
    a, b = p.state.batch_index("A"), p.state.batch_index("B")
    assert not p.state.set_ranks([(a, 0), (b, 1)], None)  # as they were
    assert p.state.set_ranks([(a, 1), (b, 0)], None)
    assert _batch_order(p, _snapshot(0.0, flows)) == ["B", "A"]
    p.on_complete(flows[0], 0.001)
    assert not p.state.set_ranks([(a, 5)], None)  # A is gone: no live batch moved


def test_a_batch_back_with_its_red_keeps_its_place_after_others_were_ranked():
    """A leaves, C arrives (a full reorder while A is away), A comes back with
    the same deadlines: its place was kept, so nothing is re-ranked."""
    p = Counting()
    flows = {name: Flow.on_path(name, 1e6, [0], stage=Stage.REUSE, request=f"{name}-r", batch=name,
                                deadline=d, layer=1, current_layer=0)
             for name, d in (("A", 0.1), ("B", 0.2), ("C", 0.3))}
    p.decide(_snapshot(0.0, [flows["A"], flows["B"]]))
    p.on_complete(flows["A"], 0.001)  # A's layer is done: it leaves
    p.decide(_snapshot(0.001, [flows["B"], flows["C"]]))  # C is new: a full reorder
    reorders = p.reorders
    assert [name for _, name, _ in p.state.gone_batches()] == ["A"]
    assert p.state.gone_batches()[0][0] == 0.1  # remembered with the RED it was ranked by
    again = Flow.on_path("A2", 1e6, [0], stage=Stage.REUSE, request="A-r", batch="A", deadline=0.1, layer=2,
                         current_layer=1)
    snap = _snapshot(0.002, [flows["B"], flows["C"], again])
    assert _batch_order(p, snap) == ["A", "B", "C"]  # A first again, B and C in their order
    assert p.reorders == reorders  # the ranks held: no reorder
