"""The ``mfs`` policy's own RED order (the live batches by their REDs, looked
up by each batch's live requests and deadlines) is ``red.red_order``'s, memo
hits included; and the state's admission is robust to a decision that raised."""

from __future__ import annotations


import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE
from laxflow.policy.red import red_order, robust_effective_deadline

ROUTES = [pytest.param(True, marks=pytest.mark.skipif(not NATIVE, reason="laxflow.policy.mfs._core is not built")),
          False]


class Counting(MfsPolicy):
    """mfs, counting the REDs its state asks it to compute (its memo's misses included)."""

    asked = 0

    def _red(self, deadlines):
        self.asked += 1
        return super()._red(deadlines)


def _snapshot(now: float, flows: list[Flow]) -> Snapshot:
    return Snapshot(now=now, flows=list(flows), remaining=np.full(len(flows), 1e6), capacity=np.full(2, 1e9),
                    link_load=np.zeros(2), load_window=0.01)


@pytest.mark.parametrize("native", ROUTES)
def test_the_live_batches_red_order_is_red_order_with_ties_empty_batches_and_memo_hits(native):
    rng = np.random.default_rng(11)
    p = MfsPolicy(native=native)
    pool = [float(x) for x in rng.uniform(0.0, 1.0, 6)]  # few values: equal REDs and repeated deadline sets
    serial, now = 0, 0.0
    for trial in range(300):
        flows, deadlines = [], {}
        for b in range(int(rng.integers(1, 9))):
            name = f"b{int(rng.integers(0, 1000)):03d}-{b}-{trial}"
            deadlines[name] = []
            for _ in range(int(rng.integers(1, 5))):
                d = None if rng.random() < 0.2 else pool[int(rng.integers(0, 6))]
                serial += 1
                flows.append(Flow.on_path(f"f{serial}", 1e6, [0], stage=Stage.REUSE, request=f"r{serial}",
                                          batch=name, deadline=d, layer=1, current_layer=0))
                if d is not None:
                    deadlines[name].append(d)
        now += 1e-3
        p.decide(_snapshot(now, flows))
        order, results = red_order(deadlines)
        keyed = p.state.live_batches()
        assert [name for _, name, _ in sorted(keyed)] == order, trial
        assert all(red == results[name].red for red, name, _ in keyed), trial
        for f in flows:
            p.on_complete(f, now)
        p.forget(list(deadlines))
    assert 0 < len(p._red_cache) < 300 * 4  # the memo by deadlines was hit


@pytest.mark.parametrize("native", ROUTES)
def test_a_returning_batch_finds_its_red_by_its_requests(native):
    """A batch leaves when its layer's last flow completes and comes back with
    the next layer's flows of the same requests: its RED is the one it left
    with, and the reference looks it up by those requests, without asking for
    it by the deadlines again (the C core asks the policy's memo)."""
    p = Counting(native=native)
    layer0 = [Flow.on_path(f"L0.{i}", 1e6, [0], stage=Stage.REUSE, request=f"r{i}", batch="b", deadline=1.0 + i,
                           layer=1, current_layer=0) for i in range(3)]
    p.decide(_snapshot(0.0, layer0))
    ((red, _, _),) = p.state.live_batches()
    assert red == robust_effective_deadline([1.0, 2.0, 3.0]).red and p.asked == 1
    for f in layer0:
        p.on_complete(f, 0.5)
    assert p.state.live_batches() == []  # gone
    layer1 = [Flow.on_path(f"L1.{i}", 1e6, [0], stage=Stage.REUSE, request=f"r{i}", batch="b", deadline=1.0 + i,
                           layer=2, current_layer=1) for i in range(3)]
    p.decide(_snapshot(0.6, layer1))
    assert p.state.live_batches()[0][0] == red
    assert p.asked == 1 + native  # found by its requests


@pytest.mark.parametrize("native", ROUTES)
def test_a_flow_whose_admission_raised_can_still_complete(native):
    """A decide that raised mid-admission (a link outside the snapshot's capacities)
    leaves a slot without facts; its on_complete must not raise (daemons call it)."""
    p = MfsPolicy(native=native)
    bad = Flow.on_path("bad", 1e6, [5], stage=Stage.P2D, request="r", batch="b", deadline=1.0)
    snap = Snapshot(now=0.0, flows=[bad], remaining=np.array([1e6]), capacity=np.full(2, 1e9),
                    link_load=np.zeros(2), load_window=0.01)
    with pytest.raises(ValueError, match="uses link 5"):
        p.decide(snap)
    p.on_complete(bad, 0.001)
    assert p.state.owners([bad]) == [None] and p.state.live_batches() == []
    good = Flow.on_path("good", 1e6, [1], stage=Stage.P2D, request="r", batch="b", deadline=1.0)
    p.decide(Snapshot(now=0.002, flows=[good], remaining=np.array([1e6]), capacity=np.full(2, 1e9),
                      link_load=np.zeros(2), load_window=0.01))
    assert p.state.owners([good])[0][2:] == ("r", 1.0, False)
