"""The two reference policies: continuous Defer-and-Promote and Karuna."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.dp_ideal import DeferAndPromoteIdeal
from laxflow.policy.karuna import Karuna
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, Topology


class Counting(DeferAndPromoteIdeal):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def decide(self, snap: Snapshot):
        self.calls += 1
        return super().decide(snap)


def run(topology: Topology, policy, flows: list[Flow]) -> None:
    net = FluidNetwork(topology, policy)
    for f in flows:
        net.queue.push(f.arrival, Priority.ARRIVAL, net.add_flow, f)
    net.run()


def leftover_topology(side: float) -> Topology:
    # x: the shared link; z caps the collective, so the p2d flow gets 1 - side on x
    return Topology.from_links(["x", "z"], [1.0, side])


def test_deferred_flow_is_promoted_exactly_when_laxity_hits_zero():
    coll = Flow.on_path("coll", 100.0, [0, 1], stage=Stage.COLLECTIVE)
    p2d = Flow.on_path("p2d", 4.0, [0], stage=Stage.P2D, deadline=7.0)
    run(leftover_topology(0.5), DeferAndPromoteIdeal(), [coll, p2d])
    # laxity 3 - 0.5 t reaches 0 at t = 6 with 1 byte left; alone on top it ends at 7
    assert p2d.finish == pytest.approx(7.0)


def test_a_deferred_flow_near_full_rate_does_not_wake_the_engine_repeatedly():
    coll = Flow.on_path("coll", 100.0, [0, 1], stage=Stage.COLLECTIVE)
    p2d = Flow.on_path("p2d", 9.0, [0], stage=Stage.P2D, deadline=10.5)
    policy = Counting()
    run(leftover_topology(0.1), policy, [coll, p2d])
    assert p2d.finish == pytest.approx(10.0)  # never needed promotion
    # arrival, one conservative timer at 1.5, p2d's completion, coll's completion
    assert policy.calls <= 5


def test_dp_ideal_levels_collective_over_reuse_by_rli_then_due():
    flows = [
        Flow.on_path("far", 1.0, [0], stage=Stage.REUSE, layer=9, current_layer=1),
        Flow.on_path("near_late", 1.0, [0], stage=Stage.REUSE, layer=2, current_layer=1, deadline=50.0),
        Flow.on_path("near_soon", 1.0, [0], stage=Stage.REUSE, layer=2, current_layer=1, deadline=20.0),
        Flow.on_path("coll", 1.0, [0], stage=Stage.COLLECTIVE),
        Flow.on_path("p2d", 1.0, [0], stage=Stage.P2D, deadline=100.0),
        Flow.on_path("p2d_no_deadline", 1.0, [0], stage=Stage.P2D, layer=1, current_layer=1),
    ]
    snap = Snapshot(now=0.0, flows=flows, remaining=np.ones(6), capacity=np.ones(1), link_load=np.zeros(1), load_window=0.01)
    d = DeferAndPromoteIdeal().decide(snap)
    order = [flows[i].id for i in np.argsort(d.level, kind="stable")]
    assert order == ["coll", "near_soon", "near_late", "far", "p2d_no_deadline", "p2d"]
    assert d.timers == (99.0,)  # laxity 100 - 0 - 1


def test_karuna_caps_deadline_flows_and_orders_the_rest_by_size():
    flows = [
        Flow.on_path("p2d", 3.0, [0], stage=Stage.P2D, deadline=7.0),
        Flow.on_path("big", 4.0, [0], stage=Stage.COLLECTIVE),
        Flow.on_path("small", 2.0, [0], stage=Stage.REUSE, deadline=18.0),  # implicit: no cap
    ]
    snap = Snapshot(now=1.0, flows=flows, remaining=np.array([2.0, 4.0, 2.0]), capacity=np.ones(1), link_load=np.zeros(1), load_window=0.01)
    d = Karuna().decide(snap)
    assert d.level.tolist() == [0, 2, 1]
    assert d.cap[0] == pytest.approx(2.0 / 6.0) and np.isinf(d.cap[1:]).all()
    assert d.timers == (7.0,)


def test_karuna_lifts_the_cap_at_the_due_time():
    late = Flow.on_path("late", 3.0, [0], stage=Stage.P2D, deadline=2.0)  # needs 1.5/s on a 1/s link
    other = Flow.on_path("other", 1.0, [0], stage=Stage.REUSE)
    run(Topology.from_links(["x"], [1.0]), Karuna(), [late, other])
    assert late.finish == pytest.approx(3.0) and other.finish == pytest.approx(4.0)
