"""The fluid engine: exact completion times, byte conservation, event order,
timers, reschedules, flow groups and link load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from laxflow.policy import Decision, Flow, FlowPolicy, Snapshot, Stage, create_policy
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network import FluidNetwork, Topology, big_switch, leaf_spine


def one_link(capacity: float = 1.0) -> Topology:
    return Topology.from_links(["L"], [capacity])


def schedule(net: FluidNetwork, flows: list[Flow]) -> None:
    for f in flows:
        net.queue.push(f.arrival, Priority.ARRIVAL, net.add_flow, f)


class Recorder(FlowPolicy):
    """Fair sharing that records every decision (time, ids) it is asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, list[str]]] = []
        self.completed: list[tuple[float, str]] = []

    def decide(self, snap: Snapshot) -> Decision:
        self.calls.append((snap.now, [f.id for f in snap.flows]))
        return self.decision(np.zeros(len(snap.flows), dtype=np.int64))

    def on_complete(self, flow: Flow, now: float) -> None:
        self.completed.append((now, flow.id))


def test_fair_share_completion_times_are_exact():
    net = FluidNetwork(one_link(), create_policy("fs"))
    flows = [Flow.on_path(i, s, [0]) for i, s in (("A", 2.0), ("B", 4.0), ("C", 3.0))]
    schedule(net, flows)
    net.run()
    assert [f.finish for f in flows] == [6.0, 9.0, 8.0]
    assert net.live == []


def test_late_arrival_shares_from_its_arrival():
    # A (size 4) alone for 1 s at rate 2, then A and B (size 1) at 1 each.
    net = FluidNetwork(one_link(2.0), create_policy("fs"))
    a = Flow.on_path("A", 4.0, [0])
    b = Flow.on_path("B", 1.0, [0], arrival=1.0)
    schedule(net, [a, b])
    net.run()
    assert b.finish == pytest.approx(2.0)
    assert a.finish == pytest.approx(2.5)


def test_rate_cap_sets_finish_time():
    class Capped(FlowPolicy):
        def decide(self, snap):
            return self.decision(np.zeros(len(snap.flows), dtype=np.int64), cap=np.full(len(snap.flows), 0.25))

    net = FluidNetwork(one_link(), Capped())
    f = Flow.on_path("A", 1.0, [0])
    schedule(net, [f])
    net.run()
    assert f.finish == pytest.approx(4.0)
    assert f.cap == 0.25 and f.level == 0


def test_strict_priority_across_levels_in_the_engine():
    net = FluidNetwork(one_link(), create_policy("sjf"))
    flows = [Flow.on_path("big", 3.0, [0]), Flow.on_path("small", 1.0, [0])]
    schedule(net, flows)
    net.run(until=0.5)
    assert net.rate_of(flows[1]) == 1.0 and net.rate_of(flows[0]) == 0.0
    assert flows[1].level == 0 and flows[0].level == 1
    net.run()
    assert flows[1].finish == 1.0 and flows[0].finish == 4.0


def random_leaf_spine_run(seed: int, policy: str = "fs", record: bool = False):
    topo = leaf_spine(32, 8, 10.0, oversubscription=2.0, num_spines=2)
    rng = np.random.default_rng(seed)
    net = FluidNetwork(topo, create_policy(policy))
    flows = []
    for i in range(60):
        s, d = (int(x) for x in rng.choice(32, 2, replace=False))
        stage = Stage(rng.choice([s.value for s in Stage]))
        flows.append(
            Flow.on_path(f"f{i}", float(rng.uniform(1, 30)), topo.path(s, d), arrival=float(rng.uniform(0, 4)), stage=stage)
        )
    schedule(net, flows)
    samples: list[tuple[float, dict[str, float]]] = []
    if record:
        while len(net.queue):
            net.queue.step()
            samples.append((net.queue.now, {f.id: net.rate_of(f) for f in flows}))
    else:
        net.run()
    return net, flows, samples


def test_bytes_equal_the_integral_of_rate():
    net, flows, samples = random_leaf_spine_run(1, record=True)
    delivered = {f.id: 0.0 for f in flows}
    # Rates are constant between consecutive events; the rate seen after the
    # last event at time t holds until the next event time.
    for (t0, rates), (t1, _) in zip(samples, samples[1:]):
        for fid, r in rates.items():
            delivered[fid] += r * (t1 - t0)
    for f in flows:
        assert f.finish is not None
        assert delivered[f.id] == pytest.approx(f.size, rel=1e-9)
    by_stage = {s: sum(f.size for f in flows if f.stage is s) for s in Stage}
    for s in Stage:
        assert net.bytes_delivered_by_stage[s] == pytest.approx(by_stage[s], rel=1e-12)


def test_runs_are_deterministic():
    _, a, _ = random_leaf_spine_run(5, "edf")
    _, b, _ = random_leaf_spine_run(5, "edf")
    assert [f.finish for f in a] == [f.finish for f in b]


def test_links_never_exceed_capacity():
    topo = leaf_spine(32, 8, 10.0, oversubscription=4.0, num_spines=2)
    rng = np.random.default_rng(2)
    net = FluidNetwork(topo, create_policy("sjf"))
    flows = [Flow.on_path(f"f{i}", 5.0, topo.path(*(int(x) for x in rng.choice(32, 2, replace=False)))) for i in range(80)]
    schedule(net, flows)
    while len(net.queue):
        net.queue.step()
        load = np.zeros(topo.num_links)
        for f in net.live:
            load[f.links] += net.rate_of(f)
        assert np.all(load <= topo.capacity * (1 + 1e-9))


def test_flow_group_equals_its_expanded_point_to_point_flows():
    n, per_pair = 4, 3.0
    topo = big_switch(n, 2.0)
    traffic = {(s, d): per_pair for s in range(n) for d in range(n) if s != d}
    links, weights, total = topo.usage(traffic)
    group = Flow(id="a2a", size=total, links=links, weights=weights, stage=Stage.COLLECTIVE)
    net = FluidNetwork(topo, create_policy("fs"))
    schedule(net, [group])
    net.run()
    expanded = [Flow.on_path(f"{s}-{d}", b, topo.path(s, d)) for (s, d), b in traffic.items()]
    net2 = FluidNetwork(topo, create_policy("fs"))
    schedule(net2, expanded)
    net2.run()
    # Each port carries 3 pairs of 3 bytes at 2 bytes/s: 4.5 s either way.
    assert group.finish == pytest.approx(4.5)
    for f in expanded:
        assert f.finish == pytest.approx(group.finish)
    assert net.bytes_delivered_by_stage[Stage.COLLECTIVE] == pytest.approx(total)


class BottleneckRecorder(FlowPolicy):
    """Fair sharing that checks each snapshot's bottleneck rates against the
    generic per-flow formula (a fresh Snapshot, no engine-filled columns)."""

    def __init__(self) -> None:
        self.checked = 0

    def decide(self, snap: Snapshot) -> Decision:
        plain = Snapshot(snap.now, snap.flows, snap.remaining, snap.capacity, snap.link_load, snap.load_window)
        np.testing.assert_allclose(snap.bottleneck_rate, plain.bottleneck_rate, rtol=1e-12)
        self.checked += len(snap.flows)
        return self.decision(np.zeros(len(snap.flows), dtype=np.int64))


def test_snapshot_bottleneck_rates_follow_admissions_and_completions():
    topo = leaf_spine(8, nics_per_leaf=4, capacity=10.0, oversubscription=2.0)
    links, weights, total = topo.usage({(s, d): 5.0 for s in range(4) for d in range(4, 8)})
    flows = [Flow(id="group", size=total, links=links, weights=weights, stage=Stage.COLLECTIVE)]
    flows += [Flow.on_path(f"p{i}", 1.0 + i, topo.path(i, (i + 5) % 8), arrival=0.5 * i) for i in range(8)]
    policy = BottleneckRecorder()
    net = FluidNetwork(topo, policy)
    schedule(net, flows)
    net.run()
    assert all(f.finish is not None for f in flows)
    assert policy.checked > len(flows)  # flows were checked while others came and went


def test_same_time_completions_complete_together_before_the_recompute():
    policy = Recorder()
    net = FluidNetwork(one_link(), policy)
    seen: list[tuple[str, float]] = []
    flows = [Flow.on_path("A", 1.0, [0]), Flow.on_path("B", 1.0, [0]), Flow.on_path("C", 3.0, [0])]
    for f in flows:
        net.queue.push(0.0, Priority.ARRIVAL, net.add_flow, f, lambda fl: seen.append((fl.id, net.queue.now)))
    net.run()
    # A and B finish at 3 (rate 1/3 each) in one event, in admission order.
    assert seen == [("A", 3.0), ("B", 3.0), ("C", 5.0)]
    assert policy.completed == [(3.0, "A"), (3.0, "B"), (5.0, "C")]
    # One decision per timestamp: at 0 (three arrivals), at 3, and none at 5
    # (the network is empty).
    assert [t for t, _ in policy.calls] == [0.0, 3.0]
    assert policy.calls[0][1] == ["A", "B", "C"]


def test_arrival_at_a_completion_time_sees_the_freed_capacity():
    policy = Recorder()
    net = FluidNetwork(one_link(), policy)
    a = Flow.on_path("A", 1.0, [0])
    b = Flow.on_path("B", 1.0, [0], arrival=1.0)
    schedule(net, [a, b])
    net.run(until=1.0)
    # A completed at 1 (COMPLETION runs before ARRIVAL), B alone gets the link.
    assert a.finish == 1.0
    assert net.rate_of(b) == 1.0
    assert policy.calls[-1] == (1.0, ["B"])


def test_callback_can_add_a_flow_at_the_completion_time():
    net = FluidNetwork(one_link(), create_policy("fs"))
    follow = Flow.on_path("next", 2.0, [0])
    first = Flow.on_path("first", 1.0, [0])
    net.queue.push(0.0, Priority.ARRIVAL, net.add_flow, first, lambda fl: net.add_flow(follow))
    net.run()
    assert follow.arrival == 1.0 and follow.finish == 3.0


def test_policy_timer_changes_levels_at_its_time():
    class Flip(FlowPolicy):
        """Favours A until t=1, then B."""

        def decide(self, snap):
            ids = [f.id for f in snap.flows]
            favour = "A" if snap.now < 1.0 else "B"
            return self.decision(np.array([0 if i == favour else 1 for i in ids]), timers=(1.0,))

    net = FluidNetwork(one_link(), Flip())
    a, b = Flow.on_path("A", 2.0, [0]), Flow.on_path("B", 1.0, [0])
    schedule(net, [a, b])
    net.run()
    # A runs 0..1, B runs 1..2, A finishes its last byte 2..3.
    assert b.finish == 2.0 and a.finish == 3.0


def test_reschedule_asks_the_policy_again():
    class ByLayer(FlowPolicy):
        def decide(self, snap):
            return self.decision(np.array([0 if f.current_layer == f.layer else 1 for f in snap.flows]))

    net = FluidNetwork(one_link(), ByLayer())
    a = Flow.on_path("A", 2.0, [0], layer=1, current_layer=0)
    b = Flow.on_path("B", 2.0, [0], layer=0, current_layer=0)
    schedule(net, [a, b])

    def layer_boundary():
        a.current_layer = 1
        b.current_layer = 1
        net.reschedule()

    net.queue.push(1.0, Priority.COMPUTE, layer_boundary)
    net.run()
    # B alone 0..1 (1 byte left), then A is promoted: A 1..3, B 3..4.
    assert a.finish == 3.0 and b.finish == 4.0
    assert a.level == 0 and b.level == 1


def test_link_load_is_an_ewma_of_utilisation():
    class Loads(FlowPolicy):
        def __init__(self):
            self.loads = []

        def decide(self, snap):
            self.loads.append((snap.now, float(snap.link_load[0])))
            return self.decision(np.zeros(len(snap.flows), dtype=np.int64), cap=np.full(len(snap.flows), 0.5))

    policy = Loads()
    net = FluidNetwork(one_link(), policy, load_window=2.0)
    schedule(net, [Flow.on_path("A", 10.0, [0])])
    net.queue.push(4.0, Priority.COMPUTE, net.reschedule)
    net.run(until=4.0)
    # Utilisation 0.5 (the cap) since t=0.
    assert policy.loads == [(0.0, 0.0), (4.0, pytest.approx(0.5 * (1 - math.exp(-2.0))))]


class LoadReader(FlowPolicy):
    """Fair sharing that records the link-load average at every decision (when
    ``read``) and asks for a recompute every ``tick`` seconds."""

    def __init__(self, read: bool = True, tick: float = 0.1) -> None:
        self.read, self.tick, self.loads = read, tick, []

    def decide(self, snap):
        if self.read:
            self.loads.append((snap.now, snap.link_load.tolist()))
        return self.decision(np.zeros(len(snap.flows), dtype=np.int64), timers=(snap.now + self.tick,))


def two_links() -> Topology:
    return Topology.from_links(["L0", "L1"], [1.0, 1.0])


def test_an_idle_links_average_decays_over_its_whole_idle_span():
    """A link no flow uses keeps its average and the time it holds at; read
    later it is that value times exp(-span / window), bit for bit (one decay
    over the span, however many events passed elsewhere), and a flow arriving
    on it again goes on from there."""
    policy = LoadReader()
    net = FluidNetwork(two_links(), policy, load_window=0.5)
    schedule(net, [Flow.on_path("A", 0.3, [0]), Flow.on_path("B", 50.0, [1])])
    net.queue.push(2.05, Priority.ARRIVAL, net.add_flow, Flow.on_path("C", 0.2, [0]))
    net.run(until=2.6)
    at_end = [(now, load[0]) for now, load in policy.loads]
    t_idle, v_idle = next((now, v) for now, v in at_end if now >= 0.3)  # A's completion: L0 idle from here
    assert t_idle == pytest.approx(0.3) and v_idle == pytest.approx(1 - math.exp(-0.3 / 0.5))
    idle = [(now, v) for now, v in at_end if t_idle < now < 2.05]
    assert len(idle) >= 15  # B's recomputes (its timer) while L0 is idle
    for now, v in idle:
        assert v == v_idle * math.exp(-(now - t_idle) / 0.5)
    # C on L0 from 2.05 (alone, rate 1): the average rises from the decayed value.
    after = [(now, v) for now, v in at_end if now > 2.05]
    start = v_idle * math.exp(-(2.05 - t_idle) / 0.5)
    now, v = after[0]
    assert v == 1.0 + (start - 1.0) * math.exp(-(now - 2.05) / 0.5)


def test_reading_the_link_load_average_changes_nothing():
    """Reading the average (a snapshot's column, the engine's property) brings
    idle links forward only in the copy read: a run that reads it at every
    decision ends with the same averages and finish times as one that never does."""
    runs = []
    for read in (True, False):
        rng = np.random.default_rng(4)
        topo = leaf_spine(8, 2, 1e9)
        net = FluidNetwork(topo, LoadReader(read, tick=3e-5), load_window=1e-4, track_link_load=True)
        flows = [Flow.on_path(f"f{i}", float(rng.exponential(3e4) + 100), topo.path(i % 8, (i * 3 + 1) % 8),
                              arrival=float(i) * 4e-6) for i in range(60)]
        schedule(net, flows)
        net.run()
        runs.append(([f.finish.hex() for f in flows], net.link_load.tolist(), net.events))
    assert runs[0] == runs[1]
    assert any(v > 0 for v in runs[0][1])


def test_bad_decisions_and_double_add_are_errors():
    class Wrong(FlowPolicy):
        def decide(self, snap):
            return self.decision(np.zeros(len(snap.flows) + 1, dtype=np.int64))

    net = FluidNetwork(one_link(), Wrong())
    schedule(net, [Flow.on_path("A", 1.0, [0])])
    with pytest.raises(ValueError, match="shape"):
        net.run()
    net = FluidNetwork(one_link(), create_policy("fs"))
    f = Flow.on_path("A", 1.0, [0])
    net.add_flow(f)
    with pytest.raises(ValueError, match="already added"):
        net.add_flow(f)
    with pytest.raises(ValueError, match="out of range"):
        net.add_flow(Flow.on_path("B", 1.0, [3]))


def test_a_cached_read_only_decision_is_checked_again_when_it_no_longer_fits():
    """A policy that hands back the same read-only arrays: taken as they are
    while they fit the flows, one clear error when a flow arrives and they
    do not (and when a value breaks the contract)."""

    class Stuck(FlowPolicy):
        def __init__(self, level: int = 0) -> None:
            self.arrays = None
            self.level = level

        def decide(self, snap):
            if self.arrays is None:
                level = np.full(len(snap.flows), self.level, dtype=np.int64)
                queue, dscp = np.zeros_like(level), np.zeros(len(snap.flows), np.uint8)
                for a in (level, queue, dscp):
                    a.flags.writeable = False
                self.arrays = (level, queue, dscp)
            return Decision(*self.arrays)

    policy = Stuck()
    net = FluidNetwork(one_link(), policy)
    a, b = Flow.on_path("A", 2.0, [0]), Flow.on_path("B", 1.0, [0], arrival=1.0)
    schedule(net, [a])
    net.run(until=0.5)
    assert net.rate_of(a) == 1.0  # the first decision, checked and kept
    schedule(net, [b])
    with pytest.raises(ValueError, match=r"decision.level has shape \(1,\), expected \(2,\)"):
        net.run()


def test_shared_queue_with_owner_events():
    queue = EventQueue()
    net = FluidNetwork(big_switch(2, 1.0), create_policy("fs"), queue)
    log = []
    f = Flow.on_path("A", 2.0, big_switch(2, 1.0).path(0, 1))
    queue.push(0.5, Priority.ARRIVAL, net.add_flow, f, lambda fl: log.append(("done", queue.now)))
    queue.push(1.0, Priority.COMPUTE, lambda: log.append(("compute", queue.now, net.remaining_of(f))))
    net.run()
    assert log == [("compute", 1.0, 1.5), ("done", 2.5)]


def test_callbacks_may_inspect_the_network_during_same_time_completions():
    net = FluidNetwork(one_link(), create_policy("fs"))
    seen = []

    def look(fl):
        seen.append((fl.id, [f.id for f in net.live], net.rate_of(fl)))

    flows = [Flow.on_path(i, 1.0, [0]) for i in "ABC"] + [Flow.on_path("D", 5.0, [0])]
    for f in flows:
        net.queue.push(0.0, Priority.ARRIVAL, net.add_flow, f, look)
    net.run()
    assert [s[0] for s in seen] == ["A", "B", "C", "D"]
    assert seen[0] == ("A", ["D"], 0.0)  # the finished flows are gone from live at once
    assert [f.finish for f in flows] == [4.0, 4.0, 4.0, 8.0]


def test_a_live_flow_cannot_be_added_again():
    net = FluidNetwork(one_link(), create_policy("fs"))
    f = Flow.on_path("A", 4.0, [0])
    net.add_flow(f)
    net.run(until=1.0)
    assert f in net.live
    with pytest.raises(ValueError, match="already added"):
        net.add_flow(f)


@pytest.mark.parametrize("policy", ["sjf", "edf", "fs"])
def test_incremental_rates_equal_a_full_recompute(policy):
    """After every timestamp, the engine's rates (which reuse untouched
    levels) equal a from-scratch allocation of the live flows."""
    from laxflow.sim.network import Usage, allocate

    topo = leaf_spine(16, 4, 10.0, oversubscription=2.0, num_spines=2)
    rng = np.random.default_rng(11)
    net = FluidNetwork(topo, create_policy(policy))
    flows = []
    for i in range(50):
        s, d = (int(x) for x in rng.choice(16, 2, replace=False))
        flows.append(
            Flow.on_path(
                f"f{i}", float(rng.uniform(1, 20)), topo.path(s, d), arrival=float(rng.integers(0, 8)),
                stage=Stage(rng.choice(["reuse", "p2d"])), deadline=float(rng.uniform(5, 20)),
            )
        )  # fmt: skip
    schedule(net, flows)
    checked = 0
    while len(net.queue):
        net.queue.step()
        if net.queue.peek_time() == net.queue.now:
            continue  # more events at this time
        live = net.live
        if not live:
            continue
        ptr = np.concatenate([[0], np.cumsum([f.links.size for f in live])])
        usage = Usage(ptr, np.concatenate([f.links for f in live]), np.concatenate([f.weights for f in live]))
        expect = allocate(topo.capacity, usage, np.array([f.level for f in live]), np.array([f.cap for f in live]))
        got = np.array([net.rate_of(f) for f in live])
        np.testing.assert_allclose(got, expect, rtol=1e-9, atol=1e-9)
        checked += 1
    assert checked > 20
    assert all(f.finish is not None for f in flows)


def test_repeated_links_are_merged_and_zero_weights_dropped():
    topo = Topology.from_links(["a", "b"], [1.0, 1.0])
    net = FluidNetwork(topo, create_policy("fs"))
    # Weight 0.5 twice on "a" is weight 1 on "a"; the zero on "b" is ignored.
    g = Flow(id="g", size=2.0, links=[0, 0, 1], weights=[0.5, 0.5, 0.0])
    other = Flow.on_path("o", 2.0, [1])
    schedule(net, [g, other])
    net.run()
    assert g.finish == 2.0 and other.finish == 2.0
    with pytest.raises(ValueError, match="no positive weight"):
        net.add_flow(Flow(id="z", size=1.0, links=[0], weights=[0.0]))
    with pytest.raises(ValueError, match="finite"):
        net.add_flow(Flow(id="n", size=1.0, links=[0], weights=[np.nan]))


def test_oversubscribed_uplink_limits_cross_leaf_traffic():
    # 4 NICs per leaf, one spine, 2:1: the leaf's uplink carries 2 x 10.
    topo = leaf_spine(8, 4, 10.0, oversubscription=2.0, num_spines=1)
    net = FluidNetwork(topo, create_policy("fs"))
    cross = [Flow.on_path(f"x{i}", 10.0, topo.path(i, 4 + i)) for i in range(4)]
    local = Flow.on_path("local", 10.0, topo.path(0, 1))
    schedule(net, cross + [local])
    net.run(until=0.0)
    assert [net.rate_of(f) for f in cross] == pytest.approx([5.0] * 4)
    # NIC 0's port is shared by x0 (held to 5 by the uplink) and the local flow.
    assert net.rate_of(local) == pytest.approx(5.0)
    net.run()
    assert [f.finish for f in cross] == pytest.approx([2.0] * 4)


def test_recompute_after_a_completion_waits_for_same_time_owner_events():
    """A completion's recompute runs in place only when nothing else is due
    at that time; an owner event at the same time (here a COMPUTE end that
    adds a flow) runs first, and the one recompute sees its flow."""
    policy = Recorder()
    queue = EventQueue()
    net = FluidNetwork(one_link(), policy, queue)
    a, b, c = Flow.on_path("A", 1.0, [0]), Flow.on_path("B", 1.0, [0]), Flow.on_path("C", 3.0, [0])
    queue.push(0.0, Priority.ARRIVAL, net.add_flow, a)
    queue.push(0.0, Priority.ARRIVAL, net.add_flow, c)
    queue.push(2.0, Priority.COMPUTE, net.add_flow, b)  # due when A completes (rate 1/2)
    net.run()
    assert a.finish == 2.0
    # One decision at 2, after B was added (not one for C alone first).
    assert policy.calls[:2] == [(0.0, ["A", "C"]), (2.0, ["C", "B"])]
    assert queue.nothing_else_now()
    queue.push(queue.now, Priority.TIMER, lambda: None)
    assert not queue.nothing_else_now()


@pytest.mark.parametrize("policy", ["mfs", "edf", "fs"])
def test_an_owner_that_reads_no_flow_fields_gets_the_same_run(policy):
    """``flow_fields=False`` (the serving simulator): no decision is written to
    the Flow objects, and every rate and finish time is the same as with them."""
    topo = leaf_spine(8, 2, 1e9, oversubscription=2.0)
    rng = np.random.default_rng(3)
    runs = []
    for fields in (True, False):
        net = FluidNetwork(topo, create_policy(policy), flow_fields=fields)
        flows = [Flow.on_path(f"f{i}", float(rng.exponential(1e6)) + 1e3, topo.path(i % 8, (i * 3 + 1) % 8),
                              arrival=i * 1e-5, stage=list(Stage)[i % 3], request=f"r{i // 3}", batch=f"b{i // 6}",
                              deadline=5e-3 + i * 1e-4, layer=i % 4, current_layer=0) for i in range(40)]
        rng = np.random.default_rng(3)  # (the same sizes for the second run)
        schedule(net, flows)
        rates = []
        net.queue.push(4e-4, Priority.ARRIVAL, lambda net=net, flows=flows: rates.extend(map(net.rate_of, flows)))
        net.run()
        runs.append(([f.finish.hex() for f in flows], [r.hex() for r in rates],
                     [(f.level, f.queue, f.dscp) for f in flows]))
    (finish_on, rates_on, fields_on), (finish_off, rates_off, fields_off) = runs
    assert finish_on == finish_off and rates_on == rates_off
    assert all(level is not None and dscp is not None for level, _, dscp in fields_on)
    assert all(field == (None, None, None) for field in fields_off)
