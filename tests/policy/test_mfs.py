"""The ``mfs`` policy: entry levels, promotion only at layer boundaries and
period ticks, monotonicity, RED ties, set_order, pruning into the scavenger."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laxflow.policy import Flow, Snapshot, Stage, create_policy
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, Topology
from laxflow.sim.network.scenario import load_scenario, run_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def snap(flows: list[Flow], now: float = 0.0, remaining=None, load: float = 0.0, capacity: float = 1.0) -> Snapshot:
    rem = np.array([f.size for f in flows]) if remaining is None else np.asarray(remaining, float)
    return Snapshot(now=now, flows=flows, remaining=rem, capacity=np.array([capacity]), link_load=np.array([load]), load_window=0.01)


def flow(id: str, stage: Stage, size: float = 1.0, **kw) -> Flow:
    return Flow.on_path(id, size, [0], stage=stage, **kw)


def finishes(path: str, policy: str) -> dict[str, float]:
    return {f["id"]: f["finish"] for f in run_scenario(load_scenario(EXAMPLES / path), policy)["flows"]}


def test_table1_every_policy():
    assert finishes("table1.json", "mfs") == {"A": 9.0, "B": 4.0, "C": 7.0}
    assert finishes("table1.json", "dp-ideal") == {"A": 9.0, "B": 4.0, "C": 7.0}
    assert finishes("table1.json", "karuna") == pytest.approx({"A": 3.5, "B": 9.0, "C": 7.0})


@pytest.mark.parametrize(
    "path, flow_id, baseline, deferred",
    [("fig6_ingress.json", "coll1", 3.0, 2.0), ("fig7_egress.json", "coll2", 4.0, 3.0)],
)
def test_deferring_p2d_shortens_the_layer(path, flow_id, baseline, deferred):
    for policy in ("fs", "sjf", "edf"):
        assert finishes(path, policy)[flow_id] == pytest.approx(baseline), policy
    for policy in ("dp-ideal", "mfs"):
        result = run_scenario(load_scenario(EXAMPLES / path), policy)
        assert {f["id"]: f["finish"] for f in result["flows"]}[flow_id] == pytest.approx(deferred), policy
        assert all(f["met"] in (True, None) for f in result["flows"]), policy  # the deferred p2d is still on time


def test_entry_levels_follow_the_layout():
    p = MfsPolicy()
    flows = [
        flow("coll", Stage.COLLECTIVE, layer=3, current_layer=3),
        flow("reuse2", Stage.REUSE, layer=5, current_layer=3),
        flow("reuse_far", Stage.REUSE, layer=40, current_layer=3),
        flow("p2d_urgent", Stage.P2D, size=6.0, deadline=10.0),  # MLU 0.6 -> top
        flow("p2d_loose", Stage.P2D, size=1.0, deadline=100.0),  # MLU 0.01 -> level 3
    ]
    d = p.decide(snap(flows))
    assert [f.state["rmlq_level"] for f in flows] == [1, 3, 7, 0, 3]
    assert [p.queue_level(f) for f in flows] == [1, 3, 7, 0, 3]
    order = np.argsort(d.level, kind="stable")
    assert [flows[i].id for i in order] == ["p2d_urgent", "coll", "reuse2", "p2d_loose", "reuse_far"]
    assert p.dscp(flows[3]) == 39 and p.dscp(flows[2]) == 32
    assert d.timers == ()  # nobody past compute


def test_promotion_only_at_layer_boundaries():
    p = MfsPolicy()
    reuse = flow("reuse", Stage.REUSE, layer=6, current_layer=0)
    p2d = flow("p2d", Stage.P2D, size=1.0, deadline=100.0, current_layer=0)
    p.decide(snap([reuse, p2d]))
    assert (reuse.state["rmlq_level"], p2d.state["rmlq_level"]) == (7, 3)
    # time passes, the deadline nears, but no layer boundary: nothing moves
    p.decide(snap([reuse, p2d], now=99.0, remaining=[1.0, 1.0]))
    assert (p.queue_level(reuse), p.queue_level(p2d)) == (7, 3)
    reuse.current_layer = p2d.current_layer = 4  # the request crossed layers 1..4
    p.decide(snap([reuse, p2d], now=99.0, remaining=[1.0, 1.0]))
    assert (p.queue_level(reuse), p.queue_level(p2d)) == (3, 0)


def test_period_promotion_after_compute_ends_with_a_timer():
    p = MfsPolicy(period=0.5)
    p2d = flow("p2d", Stage.P2D, size=1.0, deadline=100.0, compute_done=True)
    d = p.decide(snap([p2d], now=0.1))
    assert p.queue_level(p2d) == 3 and d.timers == (0.5,)
    d = p.decide(snap([p2d], now=0.3, remaining=[1.0]))  # same tick: no re-evaluation
    assert d.timers == (0.5,)
    d = p.decide(snap([p2d], now=0.5, remaining=[1.0], load=0.99))  # next tick, loaded link
    assert p.queue_level(p2d) == 0 and d.timers == ()  # at the top: nothing left to promote


def test_infeasible_flows_are_marked_and_kept_at_top():
    p = MfsPolicy()
    late = flow("late", Stage.P2D, size=5.0, deadline=2.0)
    p.decide(snap([late]))
    assert p.infeasible == {"late"} and late.state["infeasible"] and p.queue_level(late) == 0


def test_red_rank_orders_equal_rli_across_batches():
    p = MfsPolicy()
    loose = flow("a", Stage.COLLECTIVE, request="ra", deadline=50.0)
    tight = flow("b", Stage.COLLECTIVE, request="rb", deadline=5.0)
    d = p.decide(snap([loose, tight]))
    assert d.level[1] < d.level[0]
    p.set_order({"ra": 0, "rb": 1}, pruned=[])  # the coordinator says otherwise
    d = p.decide(snap([loose, tight]))
    assert d.level[0] < d.level[1]


def run(net: FluidNetwork, flows: list[Flow]) -> None:
    for f in flows:
        net.queue.push(f.arrival, Priority.ARRIVAL, net.add_flow, f)
    net.run()


def test_blackhole_in_the_engine_with_the_coordinator_order():
    """Algorithm 1's result (examples/inter_blackhole.json) enforced by mfs."""
    # Each request's own KV fetch (pruning demotes a request's own flows).
    h1 = Flow.on_path("h1", 400.0, [0], stage=Stage.REUSE, request="h1", batch="doomed", deadline=1.0)
    h2 = Flow.on_path("h2", 20.0, [0], stage=Stage.REUSE, request="h2", batch="doomed", deadline=1.1)
    f1 = Flow.on_path("f1", 100.0, [0], stage=Stage.REUSE, request="f1", batch="viable", deadline=2.0, downstream=0.3)
    policy = MfsPolicy()
    policy.set_order({"doomed": 0, "viable": 1}, pruned=["h1"])
    run(FluidNetwork(Topology.from_links(["p0"], [100.0]), policy), [h1, h2, f1])
    assert h2.finish == pytest.approx(0.2) and f1.finish == pytest.approx(1.2)
    assert f1.finish <= f1.due
    assert h1.finish == pytest.approx(5.2)  # scavenger: last, but delivered
    # without pruning the black hole takes the viable batch down with it
    g = [Flow.on_path(f.id, f.size, [0], stage=f.stage, request=f.request, batch=f.batch, deadline=f.deadline,
                      downstream=f.downstream) for f in (h1, h2, f1)]  # fmt: skip
    run(FluidNetwork(Topology.from_links(["p0"], [100.0]), MfsPolicy()), g)
    assert g[2].finish > g[2].due


def test_standalone_pruning_on_table1_spares_the_collective():
    """Pruning cannot take a collective's bytes off the link, so Algorithm 1 run
    by the policy itself finds nothing worth pruning and all three meet."""
    policy = create_policy("mfs", drop_budget=2)
    flows = [spec.build() for spec in load_scenario(EXAMPLES / "table1.json").flows]
    net = FluidNetwork(load_scenario(EXAMPLES / "table1.json").topology, policy)
    run(net, flows)
    assert policy.pruned_requests == set()
    assert {f.id: f.finish for f in flows} == {"A": 9.0, "B": 4.0, "C": 7.0}


def test_standalone_pruning_finds_the_black_hole_itself():
    """No coordinator: the policy runs Algorithm 1 on its live flows and prunes
    the doomed request, so the batch behind it meets its deadline."""
    h1 = Flow.on_path("h1", 400.0, [0], stage=Stage.REUSE, request="h1", batch="doomed", deadline=1.0)
    h2 = Flow.on_path("h2", 20.0, [0], stage=Stage.REUSE, request="h2", batch="doomed", deadline=1.1)
    f1 = Flow.on_path("f1", 100.0, [0], stage=Stage.REUSE, request="f1", batch="viable", deadline=2.0, downstream=0.3)
    policy = create_policy("mfs", drop_budget=1)
    run(FluidNetwork(Topology.from_links(["p0"], [100.0]), policy), [h1, h2, f1])
    assert policy.pruned_requests == {"h1"}
    assert h2.finish == pytest.approx(0.2) and f1.finish == pytest.approx(1.2)
    assert f1.finish <= f1.due
    assert h1.finish == pytest.approx(5.2)  # scavenger: last, but delivered


def test_pruning_demotes_a_requests_own_flows_but_not_its_batch_collective():
    """The collective carries the whole batch: demoting it with the pruned
    request it is tagged with would stall the batch's other requests."""
    fetch = Flow.on_path("fetch", 50.0, [0], stage=Stage.REUSE, request="r1", batch="b", deadline=1.0, layer=3,
                         current_layer=0)  # fmt: skip
    kv = Flow.on_path("kv", 50.0, [0], stage=Stage.P2D, request="r1", batch="b", deadline=1.0)
    coll = Flow.on_path("coll", 50.0, [0], stage=Stage.COLLECTIVE, request="r1", batch="b", deadline=1.0)
    other = Flow.on_path("other", 50.0, [0], stage=Stage.REUSE, request="r2", batch="c", deadline=9.0, layer=6,
                         current_layer=0)  # fmt: skip
    policy = MfsPolicy()
    policy.set_order({"b": 0, "c": 1}, pruned=["r1"])
    net = FluidNetwork(Topology.from_links(["p0"], [100.0]), policy)
    for f in (fetch, kv, coll, other):
        net.add_flow(f)
    net.queue.run(until=0.0)
    scavenger = policy.config.levels
    assert policy.queue_level(fetch) == scavenger and policy.queue_level(kv) == scavenger
    assert policy.queue_level(coll) == 1  # RLI 0, as if nothing were pruned
    assert policy.queue_level(other) < scavenger
    net.run()
    assert coll.finish == pytest.approx(0.5)  # first: nothing else is above it
    assert max(fetch.finish, kv.finish) == pytest.approx(2.0)  # scavenger: last, but delivered


@st.composite
def workloads(draw):
    flows = []
    for i in range(draw(st.integers(1, 8))):
        stage = draw(st.sampled_from(list(Stage)))
        req = f"r{draw(st.integers(0, 3))}"
        flows.append(Flow.on_path(
            f"f{i}", float(draw(st.integers(1, 20))), draw(st.sampled_from([[0], [1], [0, 1]])),
            arrival=float(draw(st.integers(0, 5))), stage=stage, request=req, batch=f"b{req}",
            deadline=float(draw(st.integers(1, 40))) if draw(st.booleans()) else None,
            layer=draw(st.integers(0, 12)), current_layer=0, compute_done=draw(st.booleans()),
        ))  # fmt: skip
    pruned = draw(st.sets(st.sampled_from(["r0", "r1", "r2", "r3"])))
    return flows, pruned


@settings(max_examples=60, deadline=None)
@given(workloads(), st.booleans())
def test_every_flow_finishes_and_levels_only_climb(work, external):
    """Pruned requests still finish (scavenger); no RMLQ level ever goes down."""
    flows, pruned = work
    policy = MfsPolicy(period=0.25, drop_budget=0 if external else 3)
    if external:
        policy.set_order({"br0": 0, "br1": 1}, pruned=pruned)
    net = FluidNetwork(Topology.from_links(["x", "y"], [2.0, 3.0]), policy)
    seen: dict[str, int] = {}

    def layer_boundary(t: float) -> None:
        for f in net.live:
            f.current_layer = (f.current_layer or 0) + 1
        net.reschedule()
        check()

    def check() -> None:
        for f, owner in zip(net.live, policy.state.owners(net.live)):
            if owner is not None:
                level = policy.rmlq_level(f)
                assert level <= seen.get(f.id, 99) and f.state["rmlq_level"] == level
                seen[f.id] = level

    for t in np.arange(0.5, 30.0, 0.5):
        net.queue.push(float(t), Priority.COMPUTE, layer_boundary, float(t))
    run(net, flows)
    check()
    assert all(f.finish is not None for f in flows)
    if external:
        assert policy.pruned_requests == pruned
    assert policy.state.owners(flows) == [None] * len(flows)  # every slot released


def test_a_lower_candidate_never_demotes():
    p = MfsPolicy()
    p2d = flow("p2d", Stage.P2D, size=2.0, deadline=10.0, current_layer=0)  # MLU 0.2 -> level 1
    p.decide(snap([p2d]))
    assert p.rmlq_level(p2d) == 1
    p2d.current_layer = 1  # boundary; the flow got ahead: MLU 0.1 / 9 -> candidate level 3
    p.decide(snap([p2d], now=1.0, remaining=[0.1]))
    assert p.rmlq_level(p2d) == 1


steps = st.lists(
    st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans(), st.booleans()),
    min_size=1, max_size=25,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 30), st.floats(0.5, 50.0))
def test_levels_only_climb_and_only_at_boundaries_or_ticks(seq, target, deadline):
    p = MfsPolicy(period=1.0)
    flows = [
        flow("p2d", Stage.P2D, size=4.0, deadline=deadline, current_layer=0),
        flow("reuse", Stage.REUSE, size=4.0, layer=target, current_layer=0),
    ]
    now, rem = 0.0, np.array([4.0, 4.0])
    p.decide(snap(flows, now=now, remaining=rem))
    last_eval_tick = 0  # period tick in which p2d's level was last (re)set
    for dt, frac, load, advance, done in seq:
        before = [p.rmlq_level(f) for f in flows]
        now += dt
        rem = rem * frac + 1e-3
        if advance:
            for f in flows:
                f.current_layer += 1
        if done:
            flows[0].compute_done = True
        p.decide(snap(flows, now=now, remaining=rem, load=load))
        after = [p.rmlq_level(f) for f in flows]
        assert after[0] <= before[0] and after[1] <= before[1]
        tick = int(np.floor(now + 1e-9))
        # p2d: a layer boundary, or (compute over) a tick later than its last evaluation
        if advance or (flows[0].compute_done and tick > last_eval_tick):
            last_eval_tick = tick
        else:
            assert after[0] == before[0]
        if not advance:
            assert after[1] == before[1]  # reuse: layer boundaries only


def _p2d_with_collective(collective: bool) -> tuple[Flow, MfsPolicy]:
    p2d = Flow.on_path("p2d", 5.0, [0], stage=Stage.P2D, deadline=100.0, compute_done=True)
    flows = [p2d]
    if collective:
        flows.append(Flow.on_path("coll", 90.0, [0], stage=Stage.COLLECTIVE))
    policy = MfsPolicy(period=0.5)
    run(FluidNetwork(Topology.from_links(["x"], [1.0]), policy, load_window=0.01), flows)
    return p2d, policy


def test_deadline_traffic_does_not_count_against_itself_in_rho():
    # alone on the link the deferred flow fills it: link_load -> 1, but that load is its own
    p2d, _ = _p2d_with_collective(False)
    assert p2d.state["rmlq_level"] == 2  # MLU 5/100 at entry, never promoted
    assert p2d.finish == pytest.approx(5.0)
    # behind a saturating collective the residual capacity is gone: promoted to the top
    p2d, _ = _p2d_with_collective(True)
    assert p2d.state["rmlq_level"] == 0 and p2d.finish <= p2d.due


def test_coordinator_may_prune_requests_before_their_flows_arrive():
    policy = MfsPolicy()
    names = [f"q{i}" for i in range(40)]  # more than the tables' initial size
    policy.set_order({}, pruned=names[::2])
    flows = [flow(f"f{i}", Stage.REUSE, request=n) for i, n in enumerate(names)]
    d = policy.decide(snap(flows))
    assert policy.pruned_requests == set(names[::2])
    assert [policy.queue_level(f) for f in flows] == [8, 7] * 20
    assert d.level[0] == d.level.max() and d.level[1] < d.level[0]


def test_pruned_requests_bytes_stay_out_of_later_standalone_runs():
    # Run 1 (t=0): batch B1 = {x: 100 B on a 100 B/s port, due 0.5} cannot
    # make it: x is pruned. Run 2 (t=0.1, batch B2 = {z: 60 B, due 0.95}
    # arrives): x is in the scavenger class, so its 40 B left are not in the
    # way of z (0.1 + 60/100 = 0.7 <= 0.95) and nothing more is pruned.
    # Counting x's bytes again would put z at 0.1 + 100/100 = 1.1 and prune z.
    policy = create_policy("mfs", drop_budget=1)
    x = flow("x", Stage.P2D, 100.0, request="x", batch="B1", deadline=0.5)
    policy.decide(snap([x], capacity=100.0))
    assert policy.pruned_requests == {"x"}
    z = flow("z", Stage.P2D, 60.0, request="z", batch="B2", deadline=0.95)
    d = policy.decide(snap([x, z], now=0.1, remaining=[40.0, 60.0], capacity=100.0))
    assert policy.pruned_requests == {"x"}
    assert d.queue.tolist() == [policy.config.levels, d.queue[1]] and d.queue[1] < policy.config.levels


@pytest.mark.parametrize("native", [True, False], ids=["native", "reference"])
def test_a_batch_that_returns_takes_its_red_rank_back(native):
    """A batch whose flows all finished, then sends again, ranks by its RED at
    once: it must not keep the rank it had before the others were re-ranked
    (and tie with the batch that took it)."""
    p = MfsPolicy(native=native)
    a1, b, c = (flow(n, Stage.COLLECTIVE, request=n, deadline=d) for n, d in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
    d = p.decide(snap([a1, b, c]))
    assert list(d.level) == [0, 1, 2]
    p.on_complete(a1, 0.1)
    d = p.decide(snap([b, c], now=0.1))  # a departed: b and c move up
    assert list(d.level) == [0, 1]
    a2 = flow("a2", Stage.COLLECTIVE, request="a", deadline=1.0)  # batch a sends again
    d = p.decide(snap([b, c, a2], now=0.2))
    assert list(d.level) == [1, 2, 0]


def test_a_departure_ranks_the_rest_as_a_full_reorder_would():
    """A batch departure that moves no live batch's RED skips Algorithm 1 (the
    ranks keep the departed batch's gap): the levels are those a reorder at
    every departure gives. A RED that moved in between (a request left a live
    batch) makes the next departure reorder."""
    def run(force: bool) -> list[list[int]]:
        p = MfsPolicy()
        fs = {n: flow(n, Stage.COLLECTIVE, request=n, batch=b, deadline=d)
              for n, b, d in (("a", "A", 1.0), ("b", "B", 2.0), ("c1", "C", 0.5), ("c2", "C", 3.0), ("d", "D", 2.5))}
        out, live, now = [], list(fs.values()), 0.0
        for gone in ("a", "c1", "b", "d"):
            out.append([int(x) for x in p.decide(snap(live, now=now)).level])
            p.on_complete(fs[gone], now)
            live = [f for f in live if f.id != gone]
            if force and fs[gone].batch not in {f.batch for f in live}:
                p._reorder(None)  # as before: every departure reorders (fully: no pruning to need a snapshot)
            now += 0.1
        out.append([int(x) for x in p.decide(snap(live, now=now)).level])
        return out

    levels = run(force=False)
    assert levels == run(force=True)
    # [b, c1, c2, d]: C (RED 1.75) ahead of D (2.5) and B (2.0) after A left, with no reorder;
    # c1 leaving moves C's RED to 3.0, which B's departure then applies: D ahead of C.
    assert levels[1] == [1, 0, 0, 2] and levels[3] == [1, 0]
