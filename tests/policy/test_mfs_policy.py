"""``MfsPolicy`` over either state (the C core or the reference): the route is
chosen once at construction, a request back in a live batch reorders at the
next departure, a flow's bottleneck is its own network's, bad calls are
errors, and a dropped policy is freed."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE
from laxflow.policy.mfs.reference import Reference, bottleneck
from laxflow.policy.mlu import level_of, mlu, thresholds
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine

ROUTES = [pytest.param(True, marks=pytest.mark.skipif(not NATIVE, reason="laxflow.policy.mfs._core is not built")),
          False]


def test_the_route_is_chosen_once_and_said():
    assert MfsPolicy(native=False).native is False and type(MfsPolicy(native=False).state) is Reference
    assert MfsPolicy().native is NATIVE and MfsPolicy(native=True).native is NATIVE
    with pytest.raises(AttributeError):
        MfsPolicy().native = True  # fixed at construction
    p = MfsPolicy(native=False)
    p.flow_notes = False  # (the engine's, from its flow_fields)
    assert p.state.note_levels is False and p.flow_notes is False


@pytest.mark.parametrize("native", ROUTES)
def test_a_request_back_in_a_live_batch_reorders_at_the_next_departure(native):
    """Request r3 of batch b1 leaves it and comes back (its next layer) while
    b1 stays live: b1's RED drops below b2's again. Nothing reorders then
    (r3 is known, b1 was live), but the next batch departure (b3, elsewhere)
    does, and b1's transfers go first from there on."""
    topo = leaf_spine(8, 2, 1e9)
    net = FluidNetwork(topo, MfsPolicy(native=native))
    shared = topo.path(0, 5)

    def flow(name, request, batch, deadline, size, path=shared, at=0.0):
        f = Flow.on_path(name, size, path, stage=Stage.REUSE, request=request, batch=batch,
                         deadline=deadline, layer=2, current_layer=0)
        net.queue.push(at, Priority.ARRIVAL, net.add_flow, f)
        return f

    flows = [
        flow("b2.x", "r2", "b2", 5.0, 4e6), flow("b1.x", "r1", "b1", 6.0, 4e6),
        flow("b1.y0", "r3", "b1", 1.0, 1e4, topo.path(1, 6)),  # r3's first layer: gone by 1e-5 s
        flow("b3.x", "r4", "b3", 7.0, 2e5, topo.path(2, 7)),  # departs at ~2e-4 s
        flow("b4.x", "r5", "b4", 8.0, 1e4, topo.path(3, 4), at=5e-5),  # a new batch: a reorder (b1 after b2)
        flow("b1.y", "r3", "b1", 1.0, 4e6, at=1e-4),  # r3 back: b1's RED 3.5 < 5
    ]  # fmt: skip
    net.run()
    finish = {f.id: f.finish for f in flows}
    assert finish["b3.x"] < finish["b1.x"] < finish["b2.x"]
    assert finish["b1.y"] < finish["b2.x"]


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_the_bottleneck_is_the_first_link_attaining_the_least_capacity_per_weight():
    f = Flow(id="f", size=1.0, links=np.array([0, 1, 2]), weights=np.array([1.0, 2.0, 1.0]), stage=Stage.P2D)
    assert bottleneck(f, np.array([2.0, 4.0, 2.0])) == (0, 2.0, 1.0)  # a tie: the first
    assert bottleneck(f, np.array([4.0, 4.0, 1.0])) == (2, 1.0, 1.0)
    g = Flow(id="g", size=1.0, links=np.array([0, 1]), weights=np.array([0.0, 1.0]), stage=Stage.P2D)
    assert bottleneck(g, np.array([5.0, 3.0])) == (1, 3.0, 1.0)  # a zero weight: no limit there


@pytest.mark.parametrize("native", ROUTES)
@pytest.mark.parametrize("frozen", [True, False])
def test_a_shared_shape_has_each_networks_bottleneck(native, frozen):
    """The serving simulator shares read-only usage arrays among flows: under
    another capacity array the same shape has another bottleneck, so another
    MLU level."""
    links, weights = np.array([0, 1, 2]), np.array([1.0, 2.0, 1.0])
    if frozen:
        links, weights = _frozen(links), _frozen(weights)
    levels = []
    for capacity in (np.array([4.0, 4.0, 1.0]), np.array([50.0, 200.0, 200.0])):
        p = MfsPolicy(native=native)
        f = Flow(id="f", size=5.0, links=links, weights=weights, stage=Stage.P2D, request="r", batch="b",
                 deadline=10.0)
        p.decide(Snapshot(now=0.0, flows=[f], remaining=np.array([5.0]), capacity=capacity,
                          link_load=np.zeros(3), load_window=0.01))
        _, rate, _ = bottleneck(f, capacity)
        q = thresholds(p.config.levels, p.config.E, p.config.U)
        want = level_of(mlu(np.array([5.0]), np.array([10.0]), np.array([rate]), np.zeros(1)), q)
        assert p.rmlq_level(f) == int(want[0])
        levels.append(p.rmlq_level(f))
    assert levels[0] != levels[1]


@pytest.mark.parametrize("native", ROUTES)
def test_bad_calls_are_errors(native):
    p = MfsPolicy(native=native)
    f = Flow.on_path("f", 1.0, [0], stage=Stage.REUSE)
    with pytest.raises(KeyError):
        p.queue_level(f)  # no slot: never decided
    with pytest.raises(ValueError, match="MfsConfig.load_window is 0.01 s"):
        p.decide(Snapshot(now=0.0, flows=[f], remaining=np.ones(1), capacity=np.ones(1), link_load=np.zeros(1),
                          load_window=0.5))
    with pytest.raises(TypeError):
        p.state.decide()
    far = Flow.on_path("far", 1.0, [0, 5], stage=Stage.REUSE)
    with pytest.raises(ValueError, match="flow 'far' uses link 5, but the network has 2 links"):
        p.decide(Snapshot(now=0.0, flows=[far], remaining=np.ones(1), capacity=np.ones(2), link_load=np.zeros(2),
                          load_window=p.config.load_window))
    with pytest.raises(ValueError, match="Snapshot.remaining has 2 values for 1 flows"):
        p.decide(Snapshot(now=0.0, flows=[f], remaining=np.ones(2), capacity=np.ones(1), link_load=np.zeros(1),
                          load_window=p.config.load_window))
    with pytest.raises(IndexError):
        p.state.set_ranks([(10**9, 0)], None)
    with pytest.raises((KeyError, IndexError)):
        p.state.deadlines(5)  # not a live batch
    with pytest.raises(KeyError):
        p.state.prune(["never-seen"])
    with pytest.raises(TypeError):
        p.state.owners(5)


@pytest.mark.parametrize("native", ROUTES)
def test_a_dropped_policy_is_freed(native):
    """The policy holds its state and the state the policy's callbacks: the collector must see the cycle."""
    topo = leaf_spine(8, 2, 1e9)
    policy = MfsPolicy(native=native)
    net = FluidNetwork(topo, policy)
    for i in range(5):
        net.queue.push(i * 1e-5, Priority.ARRIVAL, net.add_flow, Flow.on_path(f"f{i}", 1e5, topo.path(i, 7 - i)))
    net.run()
    gone = weakref.ref(policy)
    del policy, net
    gc.collect()
    assert gone() is None
