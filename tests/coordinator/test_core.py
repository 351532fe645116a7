"""The coordinator's state machine with a fake clock: no sockets."""

from __future__ import annotations

import pytest

from laxflow.coordinator.core import CoordinatorConfig, CoordinatorCore, Publish, Reply
from laxflow.errors import UserError
from laxflow.policy.inter_request import InterBatch, InterProblem, InterRequest, schedule
from laxflow.protocol import messages as m
from laxflow.protocol.wire import decode, encode

GB = 1e9


def env(msg, sender="n1"):
    return decode(encode(msg, sender))  # through the codec, as the server does


def req(rid, deadline, nbytes=0.0, src="n1/p0", dst="n2/p0"):
    return m.RequestInfo(rid, deadline, 100, 0, (m.Transfer(src, dst, nbytes),))


def batch(bid, *reqs, compute=0.0):
    return m.BatchInfo(bid, compute, tuple(reqs))


def hello(node, ports=(), batches=()):
    return m.Hello(node, "start", tuple(m.PortInfo(p, GB) for p in ports), tuple(batches))


@pytest.fixture
def core():
    c = CoordinatorCore(CoordinatorConfig(drop_budget=1, coordinator_id="c0"), now=0.0)
    c.handle(env(hello("n1", ["n1/p0"])), b"id1", 0.0)
    c.handle(env(hello("n2", ["n2/p0"]), "n2"), b"id2", 0.0)
    c.decide(0.0)
    return c


def test_config_is_checked():
    with pytest.raises(UserError, match="dead-after"):
        CoordinatorConfig(heartbeat_s=1.0, dead_after_s=0.5)
    with pytest.raises(UserError, match="drop budget"):
        CoordinatorConfig(drop_budget=-1)
    assert CoordinatorConfig().coordinator_id != CoordinatorConfig().coordinator_id


def test_hello_gets_welcome():
    c = CoordinatorCore(CoordinatorConfig(coordinator_id="c0"), now=0.0)
    out = c.handle(env(hello("n1", ["n1/p0"])), b"x", 0.0)
    assert out == [Reply(b"x", m.Welcome("c0", 0.5, 2.0))]
    assert c.ports() == {"n1/p0": GB}


def test_red_order_on_arrival_and_departure(core):
    # b_late: RED 10; b_soon: RED 2 -> b_soon first whatever the arrival order
    core.handle(env(m.BatchArrival("n1", batch("b_late", req("r1", 10.0)))), b"id1", 0.1)
    core.handle(env(m.BatchArrival("n1", batch("b_soon", req("r2", 2.0)))), b"id1", 0.1)
    d = core.decide(0.1)
    assert [r.batch_id for r in d.order] == ["b_soon", "b_late"]
    assert [r.rank for r in d.order] == [0, 1]
    assert d.order[0].nodes == ("n1",) and d.order[0].red == 2.0
    assert d.trigger == "arrival b_late, arrival b_soon"
    assert core.decide(0.2) is None  # nothing changed: no run
    core.handle(env(m.BatchDeparture("n1", "b_soon")), b"id1", 0.3)
    d2 = core.decide(0.3)
    assert [r.batch_id for r in d2.order] == ["b_late"] and d2.seq == d.seq + 1


def test_infeasible_batch_prunes_heaviest_and_it_stays_pruned(core):
    # one 1 GB/s port; the urgent batch is fine, the second cannot make its deadline:
    # its heaviest request on the bottleneck port goes to the scavenger class.
    core.handle(env(m.BatchArrival("n1", batch("a", req("a1", 1.0, 0.5 * GB)))), b"id1", 0.0)
    core.handle(env(m.BatchArrival("n1", batch("b", req("b1", 1.0, 0.6 * GB), req("b2", 1.05, 0.1 * GB)))), b"id1", 0.0)
    d = core.decide(0.0)
    assert [r.batch_id for r in d.order] == ["a", "b"]
    assert d.pruned == ("b1",)
    # a later run keeps it pruned (sticky) and its load out of the check
    core.handle(env(m.BatchArrival("n1", batch("c", req("c1", 9.0, 1.0)))), b"id1", 0.1)
    assert core.decide(0.1).pruned == ("b1",)
    core.handle(env(m.BatchDeparture("n1", "b")), b"id1", 0.2)
    assert core.decide(0.2).pruned == ()


def test_same_answer_as_algorithm1_on_the_problem():
    """One policy code path: the coordinator's decision is schedule() on the same problem."""
    c = CoordinatorCore(CoordinatorConfig(drop_budget=3, coordinator_id="c0"), now=0.0)
    ports = {"n1/p0": 1 * GB, "n1/p1": 2 * GB, "n2/p0": 1 * GB}
    c.handle(env(m.Hello("n1", "start", (m.PortInfo("n1/p0", GB), m.PortInfo("n1/p1", 2 * GB)), ())), b"1", 0.0)
    c.handle(env(m.Hello("n2", "start", (m.PortInfo("n2/p0", GB),), ()), "n2"), b"2", 0.0)
    spec = {
        "x": (0.01, [("x1", 0.5, "n1/p0", 0.3), ("x2", 0.9, "n1/p1", 0.8)]),
        "y": (0.02, [("y1", 0.4, "n1/p0", 0.6), ("y2", 0.45, "n1/p1", 0.2), ("y3", 2.0, "n1/p0", 0.1)]),
        "z": (0.00, [("z1", 0.3, "n1/p1", 0.5)]),
    }
    batches = []
    for bid, (compute, reqs) in spec.items():
        infos, inter = [], []
        for rid, dl, src, gb in reqs:
            infos.append(req(rid, dl, gb * GB, src=src, dst="n2/p0"))
            inter.append(InterRequest(rid, dl, {src: gb * GB, "n2/p0": gb * GB}))
        c.handle(env(m.BatchArrival("n1", batch(bid, *infos, compute=compute))), b"1", 0.05)
        batches.append(InterBatch(bid, compute, tuple(inter)))
    d = c.decide(0.05)
    want = schedule(InterProblem(ports=ports, batches=tuple(batches), now=0.05, drop_budget=3))
    assert [r.batch_id for r in d.order[: len(want.order)]] == want.order
    assert list(d.pruned) == want.pruned and want.pruned  # something was pruned
    assert {r.batch_id: r.finish for r in d.order} == pytest.approx(want.finish)


def test_unknown_daemon_is_asked_to_resync_rate_limited():
    c = CoordinatorCore(CoordinatorConfig(coordinator_id="c0"), now=0.0)
    hb = m.Heartbeat("n9", 3, 1, "local", "", -1, ())
    assert c.handle(env(hb, "n9"), b"z", 1.0) == [Reply(b"z", m.ResyncRequest("c0", "unknown daemon"))]
    assert c.handle(env(hb, "n9"), b"z", 1.2) == []  # its Hello is on its way
    # still disagrees (1 batch reported, 0 known) after half a dead-after period: ask again
    assert c.handle(env(hb, "n9"), b"z", 2.1) == [Reply(b"z", m.ResyncRequest("c0", "batch count mismatch"))]
    c.handle(env(m.Hello("n9", "resync", (), (batch("b", req("r", 5.0)),)), "n9"), b"z", 2.2)
    assert c.handle(env(hb, "n9"), b"z", 3.5) == []
    assert [r.batch_id for r in c.decide(3.5).order] == ["b"]


def test_hello_replaces_the_nodes_state(core):
    core.handle(env(m.BatchArrival("n1", batch("old", req("o1", 3.0)))), b"id1", 0.0)
    core.decide(0.0)
    core.handle(env(m.Hello("n1", "reconnect", (m.PortInfo("n1/p0", GB),), (batch("new", req("n1", 4.0)),))), b"id1b", 0.5)
    d = core.decide(0.5)
    assert [r.batch_id for r in d.order] == ["new"]
    assert core.daemons["n1"].identity == b"id1b"


def test_dead_daemon_loses_its_batches_and_republish():
    c = CoordinatorCore(CoordinatorConfig(heartbeat_s=0.5, dead_after_s=2.0, coordinator_id="c0"), now=0.0)
    c.handle(env(hello("n1", ["n1/p0"], [batch("b1", req("r1", 5.0))])), b"1", 0.0)
    c.handle(env(hello("n2", ["n2/p0"], [batch("b2", req("r2", 6.0))]), "n2"), b"2", 0.0)
    first = c.decide(0.0)
    assert c.tick(1.0) == [Publish(first)]  # nothing new: the last decision again, for late joiners
    c.handle(env(m.Heartbeat("n2", 1, 1, "coordinated", "c0", 0, ()), "n2"), b"2", 1.5)
    c.tick(2.5)  # n1 silent for 2.5 s > 2.0
    d = c.decide(2.5)
    assert [r.batch_id for r in d.order] == ["b2"] and "dead n1" in d.trigger
    assert c.ports() == {"n2/p0": GB}  # a dead daemon's ports leave Algorithm 1


def test_dead_daemon_stays_in_the_view_until_forgotten():
    """`laxflow status` dropped a dead daemon: it stays, dead, with its last-seen age, until forget-after."""
    c = CoordinatorCore(CoordinatorConfig(heartbeat_s=0.5, dead_after_s=2.0, forget_after_s=60.0, coordinator_id="c0"),
                        now=0.0)
    c.handle(env(hello("n1", ["n1/p0"], [batch("b1", req("r1", 5.0))])), b"1", 0.0)
    c.handle(env(hello("n2", ["n2/p0"]), "n2"), b"2", 0.0)
    c.decide(0.0)
    for t in (1.0, 2.0, 3.0):
        c.handle(env(m.Heartbeat("n2", int(t), 0, "coordinated", "c0", 0, ()), "n2"), b"2", t)
        c.tick(t)
    s = c.status(3.0, True, m.LatencySummary(0, 0, 0, 0, 0), {})
    n1, n2 = s.daemons
    assert (n1.node, n1.alive, n1.heartbeat_age, n1.batches) == ("n1", False, 3.0, 0)
    assert n1.ports == (m.PortInfo("n1/p0", GB),)  # what it had, for the operator
    assert n2.alive and s.active_batches == 0
    assert c.ports() == {"n2/p0": GB}
    # it comes back: asked for its full state, alive again
    out = c.handle(env(m.Heartbeat("n1", 9, 1, "local", "", -1, ())), b"1b", 10.0)
    assert out == [Reply(b"1b", m.ResyncRequest("c0", "unknown daemon"))]
    assert c.status(10.0, False, m.LatencySummary(0, 0, 0, 0, 0), {}).daemons[0].alive
    c.handle(env(hello("n1", ["n1/p0"], [batch("b1", req("r1", 50.0))])), b"1b", 10.1)
    assert [r.batch_id for r in c.decide(10.1).order] == ["b1"]
    # silent for good: dead at 12.1+, forgotten after forget-after (60 s)
    c.tick(13.0)
    assert [d.node for d in c.status(13.0, False, m.LatencySummary(0, 0, 0, 0, 0), {}).daemons] == ["n1", "n2"]
    c.tick(71.0)
    assert "n1" not in c.daemons


def test_forget_after_is_checked():
    with pytest.raises(UserError, match="forget-after"):
        CoordinatorConfig(dead_after_s=2.0, forget_after_s=1.0)


def test_batch_across_two_nodes_merges_and_departs_when_both_left(core):
    core.handle(env(m.BatchArrival("n1", batch("ep", req("r1", 1.0, 0.2 * GB, "n1/p0", "n2/p0"), compute=0.01))), b"id1", 0.0)
    core.handle(env(m.BatchArrival("n2", batch("ep", req("r1", 1.0, 0.1 * GB, "n2/p0", "n1/p0"), req("r2", 1.1), compute=0.03)), "n2"), b"id2", 0.0)
    d = core.decide(0.0)
    assert d.order[0].nodes == ("n1", "n2")
    b = core.batches["ep"]
    assert b.request_ids == ["r1", "r2"] and b.compute == 0.03
    # port n2/p0 carries 0.2 + 0.1 GB at 1 GB/s: finish = compute + 0.3 s
    assert d.order[0].finish == pytest.approx(0.33)
    core.handle(env(m.BatchDeparture("n1", "ep")), b"id1", 0.1)
    assert [r.batch_id for r in core.decide(0.1).order] == ["ep"]
    core.handle(env(m.BatchDeparture("n2", "ep"), "n2"), b"id2", 0.2)
    assert core.decide(0.2).order == () and not core.owner


def test_request_in_two_batches_is_refused_and_counted(core):
    core.handle(env(m.BatchArrival("n1", batch("b1", req("r", 1.0)))), b"id1", 0.0)
    core.handle(env(m.BatchArrival("n1", batch("b2", req("r", 2.0)))), b"id1", 0.0)
    assert core.conflicts == 1 and set(core.batches) == {"b1"}


def test_traffic_to_unknown_ports_is_left_out(core):
    core.handle(env(m.BatchArrival("n1", batch("b", req("r", 100.0, 10 * GB, "n1/p0", "elsewhere/p9")))), b"id1", 0.0)
    d = core.decide(0.0)
    assert d.order[0].finish == pytest.approx(10.0)  # only n1/p0's 1 GB/s counted


def test_status(core):
    core.handle(env(m.BatchArrival("n1", batch("b", req("r", 1.0), req("q", 1.5)))), b"id1", 0.0)
    core.handle(env(m.Heartbeat("n1", 1, 1, "coordinated", "c0", 0, (m.QueueDepth("n1/p0", 2, 5, 500),))), b"id1", 0.1)
    core.decide(0.1)
    s = core.status(0.2, True, m.LatencySummary(1, 0.1, 0.1, 0.1, 0.1), {"malformed": 0})
    assert (s.active_batches, s.active_requests, s.seq) == (1, 2, core.seq)
    assert [d.node for d in s.daemons] == ["n1", "n2"] and s.daemons[0].queues[0].messages == 5
    assert s.batches[0].id == "b" and s.batches[0].rank == 0
    assert decode(encode(s, "c")).body == s


def test_trigger_names_four_events_and_counts_the_rest(core):
    for k in range(6):
        core.handle(env(m.BatchArrival("n1", batch(f"b{k}", req(f"r{k}", 5.0 + k)))), b"id1", 0.0)
    d = core.decide(0.0)
    assert d.trigger == "arrival b0, arrival b1, arrival b2, arrival b3 +2"
    core.handle(env(m.BatchDeparture("n1", "b0")), b"id1", 0.1)
    assert core.decide(0.1).trigger == "departure b0"


def test_pruning_survives_a_resync_hello_that_still_reports_the_batch(core):
    # A resync (heartbeat batch-count mismatch, reconnect) sends the node's full state again: batches it
    # still reports have not departed, so their pruned requests stay pruned (sticky until departure).
    a = batch("a", req("a1", 1.0, 0.5 * GB))
    b = batch("b", req("b1", 1.0, 0.6 * GB), req("b2", 1.05, 0.1 * GB))
    core.handle(env(m.BatchArrival("n1", a)), b"id1", 0.0)
    core.handle(env(m.BatchArrival("n1", b)), b"id1", 0.0)
    assert core.decide(0.0).pruned == ("b1",)
    # b1's report shrank (a fresh run would not prune it now): still pruned, the batch has not departed
    b_again = batch("b", req("b1", 1.0, 0.01 * GB), req("b2", 1.05, 0.1 * GB))
    core.handle(env(m.Hello("n1", "resync", (m.PortInfo("n1/p0", GB),), (a, b_again))), b"id1", 0.3)
    assert core.decide(0.3).pruned == ("b1",)
    # a Hello that no longer lists b: b departed, its pruning goes with it
    core.handle(env(m.Hello("n1", "resync", (m.PortInfo("n1/p0", GB),), (a,))), b"id1", 0.4)
    assert core.decide(0.4).pruned == ()


def test_decision_fast_path_equals_the_generic_encoder(core):
    from laxflow.coordinator.server import decision_frame

    core.handle(env(m.BatchArrival("n1", batch("a", req("a1", 1.0, 0.5 * GB)))), b"id1", 0.0)
    core.handle(env(m.BatchArrival("n2", batch("b", req("b1", 1.0, 0.6 * GB, src="n2/p0", dst="n1/p0"),
                                                 req("b2", 1.05, 0.1 * GB))), "n2"), b"id2", 0.0)
    d = core.decide(0.0)
    assert d.pruned and len(d.order) == 2
    fast_frame = decision_frame(d, "coordinator")
    fast = decode(fast_frame)
    slow = decode(encode(d, "coordinator"))  # validated by the sender's checker too
    assert fast.body == slow.body == d and fast.type == slow.type
    # byte for byte the generic encoder's frame, given the same envelope
    assert fast_frame == encode(d, "coordinator", msg_id=fast.msg_id, ts=fast.ts)
