"""The daemon core as a pure state machine, driven with a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.daemon.core import COMPUTE_DONE_LAYER, CoreConfig, DaemonCore
from laxflow.daemon.gate import grants
from laxflow.daemon.ports import PortSpec
from laxflow.errors import UserError
from laxflow.policy.config import MfsConfig
from laxflow.policy.flow import Stage
from laxflow.protocol.shm import EVENT_DTYPE

GBPS100 = 100e9 / 8


def create_core(window=0.0, ports=("eth0",), **kw) -> DaemonCore:
    return DaemonCore(CoreConfig(ports=tuple(PortSpec(p, GBPS100) for p in ports), window_bytes=window, **kw))


def granted(result) -> list[int]:
    return [p.msg_id for p in result.permits]


# ------------------------------------------------------------------ permit rule


def test_gate_grants_the_top_rank_and_holds_lower_ones_until_the_window():
    rank = [0, 1, 1, 2]
    rem = [100.0, 50.0, 50.0, 10.0]
    everyone = [True] * 4
    assert grants(rank, rem, everyone, window=0.0) == [True, False, False, False]
    # Below the window the next rank goes too (both of equal rank), and then the third: 100+100 >= 150 stops it.
    assert grants(rank, rem, everyone, window=150.0) == [True, True, True, False]
    assert grants(rank, rem, everyone, window=201.0) == [True, True, True, True]
    # Already granted messages are never granted again but still count ahead.
    waiting = [False, True, True, True]
    assert grants(rank, rem, waiting, window=0.0) == [False, False, False, False]
    assert grants(rank, [0.0, 50, 50, 10], waiting, window=0.0) == [False, True, True, False]
    # Order of the input does not matter, only ranks.
    assert grants([2, 0, 1], [1.0, 1.0, 1.0], [True] * 3, window=0.0) == [False, True, False]


def test_collective_goes_first_reuse_waits_then_follows_on_completion():
    core = create_core()
    core.register_request("r1", deadline=1.0)
    core.batch_formed("b1", ["r1"], 0.0)
    core.layer_begin("b1", 0, 0.0)
    core.submit(1, "r1", Stage.REUSE, 3, 1e6, 0.0)
    core.submit(2, "r1", Stage.COLLECTIVE, 0, 1e6, 0.0)
    out = core.step(0.0)
    assert granted(out) == [2]
    assert out.permits[0].level == 1 and out.permits[0].dscp == 38  # RLI 0 -> RMLQ level 1 -> DSCP 38
    assert core.queue_depths() == {("eth0", 4): 1}  # reuse 3 layers ahead: RLI 3 -> level 4
    assert core.step(0.001).permits == []  # nothing changed: nothing granted
    core.complete(2, 0.002)
    out = core.step(0.002)
    assert granted(out) == [1] and out.cleared == [2]
    assert out.permits[0].level == 4 and out.permits[0].dscp == 35
    assert out.permits[0].waited == pytest.approx(0.002)


def test_work_conserving_window_lets_the_next_rank_start_while_the_last_bytes_drain():
    core = create_core(window=2e5)
    core.batch_formed("b1", ["r1"], 0.0)
    core.layer_begin("b1", 0, 0.0)
    core.submit(1, "r1", Stage.COLLECTIVE, 0, 1e6, 0.0)
    core.submit(2, "r1", Stage.REUSE, 2, 1e6, 0.0)
    assert granted(core.step(0.0)) == [1]
    core.progress(1, 7e5, 1e-5)  # 3e5 left: still above the window
    assert granted(core.step(1e-5)) == []
    core.progress(1, 9e5, 2e-5)  # 1e5 left: below
    assert granted(core.step(2e-5)) == [2]


def test_layer_boundary_promotes_waiting_reuse_and_permit_carries_new_level():
    core = create_core()
    core.batch_formed("b1", ["r1"], 0.0)
    core.layer_begin("b1", 0, 0.0)
    core.submit(1, "r1", Stage.COLLECTIVE, 0, 1e6, 0.0)
    core.submit(2, "r1", Stage.REUSE, 3, 1e6, 0.0)
    core.step(0.0)
    assert core.messages[2].queue == 4
    core.layer_begin("b1", 2, 0.001)  # RLI 1 now
    core.step(0.001)
    assert core.messages[2].queue == 2
    core.layer_begin("b1", 1, 0.002)  # a late boundary never demotes
    core.step(0.002)
    assert core.messages[2].queue == 2
    core.complete(1, 0.003)
    out = core.step(0.003)
    assert [(p.msg_id, p.level, p.dscp) for p in out.permits] == [(2, 2, 37)]


def test_p2d_after_compute_end_promotes_on_the_period_timer():
    core = create_core(mfs=MfsConfig(period=1e-3))
    core.register_request("r1", deadline=0.1)
    core.batch_formed("b1", ["r1"], 0.0)
    core.layer_begin("b1", 0, 0.0)
    core.submit(1, "r1", Stage.COLLECTIVE, 0, 1e9, 0.0)  # keeps the port busy
    core.submit(2, "r1", Stage.P2D, 0, 1e8, 0.0)  # MLU 1e8 / (0.1 * 12.5e9) = 0.08 -> level 2
    core.step(0.0)
    assert core.messages[2].queue == 2
    core.compute_done("b1", 0.0005)
    out = core.step(0.0005)
    assert out.next_timer == pytest.approx(1e-3)
    assert core.messages[2].queue == 2  # not before the tick
    out = core.step(0.09)  # close to the deadline: MLU 1e8 / (0.01 * 12.5e9) = 0.8 -> top
    assert core.messages[2].queue == 0


def test_two_batches_at_one_level_are_granted_in_red_order():
    core = create_core()
    for name, deadline in (("late", 0.9), ("early", 0.2)):
        core.register_request(name, deadline=deadline)
        core.batch_formed(f"b-{name}", [name], 0.0)
        core.layer_begin(f"b-{name}", 0, 0.0)
    core.submit(1, "late", Stage.COLLECTIVE, 0, 1e6, 0.0)
    core.submit(2, "early", Stage.COLLECTIVE, 0, 1e6, 0.0)
    out = core.step(0.0)
    assert granted(out) == [2]  # same RMLQ level (1), RED rank decides
    assert core.messages[1].queue == core.messages[2].queue == 1
    core.complete(2, 1e-4)
    assert granted(core.step(1e-4)) == [1]


def test_coordinator_order_and_pruning_apply():
    core = create_core()
    for name, deadline in (("a", 0.2), ("b", 0.3)):
        core.register_request(name, deadline=deadline)
        core.batch_formed(f"b-{name}", [name], 0.0)
        core.layer_begin(f"b-{name}", 0, 0.0)
    core.apply_order({"b-b": 0, "b-a": 1}, pruned=["a"])
    core.submit(1, "a", Stage.REUSE, 0, 1e6, 0.0)
    core.submit(2, "b", Stage.REUSE, 0, 1e6, 0.0)
    out = core.step(0.0)
    assert granted(out) == [2]
    assert core.messages[1].queue == 8  # scavenger: K
    assert core.pruned() == {"a"}
    core.complete(2, 1e-4)
    out = core.step(1e-4)
    assert [(p.msg_id, p.level, p.dscp) for p in out.permits] == [(1, 8, 8)]  # still completes, CS1


def test_ports_are_independent_and_shm_events_map_through_bound_handles():
    core = create_core(ports=("eth0", "eth1"))
    core.bind_handle(pid=7, handle=42, port="eth1")
    ev = np.zeros(4, dtype=EVENT_DTYPE)
    ev["kind"] = [1, 1, 3, 1]
    ev["pid"] = 7
    ev["msg_id"] = [11, 12, 0, 13]
    ev["request_id"] = 5
    ev["bytes"] = 1 << 20
    ev["t_ns"] = [1_000, 2_000, 3_000, 4_000]
    ev["stage"] = [2, 1, 0, 1]  # collective, reuse, -, reuse
    ev["layer"] = [0, 4, 1, 5]
    ev["handle"] = [1, 1, 0, 42]
    core.ingest(ev)
    out = core.step(5e-6)
    # Port eth0: the collective goes, the reuse waits; eth1 has only the reuse 13, which goes.
    assert sorted(granted(out)) == [11, 13]
    assert {core.ports[core.messages[m].port].name for m in (11, 12)} == {"eth0"}
    assert core.messages[13].port == 1
    assert core.batches["5"].current_layer == 1
    bad = np.zeros(1, dtype=EVENT_DTYPE)
    bad["kind"] = 99
    core.ingest(bad)
    assert core.stats["bad_events"] == 1
    done = np.zeros(1, dtype=EVENT_DTYPE)
    done["kind"], done["request_id"], done["layer"], done["t_ns"] = 3, 5, COMPUTE_DONE_LAYER, 6_000
    core.ingest(done)
    assert core.batches["5"].compute_done


def test_reports_only_on_batch_arrival_and_departure():
    core = create_core()
    core.register_request("r1", deadline=0.5)
    core.batch_formed("b1", ["r1"], 0.0, compute=0.01, traffic={"eth0": {"r1": 3e6}})
    reports = core.step(0.0).reports
    assert [(r.kind, r.batch, r.deadlines, r.compute) for r in reports] == [("arrival", "b1", {"r1": 0.5}, 0.01)]
    assert reports[0].traffic == {"eth0": {"r1": 3e6}}
    for layer in range(5):
        core.layer_begin("b1", layer, layer * 1e-3)
        core.submit(10 + layer, "r1", Stage.COLLECTIVE, layer, 1e5, layer * 1e-3)
        core.complete(10 + layer, layer * 1e-3 + 1e-4)
        assert core.step(layer * 1e-3 + 1e-4).reports == []  # never per layer
    core.compute_done("b1", 0.006)
    core.submit(20, "r1", Stage.P2D, 4, 1e5, 0.006)
    core.complete(20, 0.007)
    assert core.step(0.007).reports == []  # compute end is not the batch's end
    core.request_done("r1", 0.007)
    reports = core.step(0.007).reports
    assert [(r.kind, r.batch) for r in reports] == [("departure", "b1")]
    assert not core.batches


def test_declared_traffic_is_not_counted_again_when_its_messages_come():
    """The coordinator's feasibility check gets each request's bytes per port
    once: the engine's declaration at batch_formed, or what the messages
    carry where that is more -- a declared transfer submitted before the
    arrival report is not added on top of its declaration."""
    core = create_core()
    core.register_request("r1", deadline=0.5)
    core.register_request("r2", deadline=0.5)
    core.batch_formed("b1", ["r1", "r2"], 0.0, compute=0.01, traffic={"eth0": {"r1": 3e6}})
    core.submit(1, "r1", Stage.P2D, 0, 1e6, 0.0)  # part of r1's declared 3 MB
    core.submit(2, "r2", Stage.P2D, 0, 2e6, 0.0)  # r2 declared nothing: its messages are all we know
    reports = core.step(0.0).reports
    assert reports[0].traffic == {"eth0": {"r1": 3e6, "r2": 2e6}}
    core.submit(3, "r1", Stage.P2D, 1, 2.5e6, 1e-3)  # now more than declared: the messages count
    core.complete(1, 2e-3), core.complete(2, 2e-3), core.complete(3, 2e-3)
    core.request_done("r1", 2e-3), core.request_done("r2", 2e-3)
    departure = [r for r in core.step(2e-3).reports if r.kind == "departure"]
    assert departure[0].traffic == {"eth0": {"r1": 3.5e6, "r2": 2e6}}


def test_open_all_releases_everything_waiting():
    core = create_core()
    core.batch_formed("b1", ["r1"], 0.0)
    core.layer_begin("b1", 0, 0.0)
    for i in range(1, 4):
        core.submit(i, "r1", Stage.REUSE, i, 1e6, 0.0)
    assert granted(core.step(0.0)) == [1]
    assert sorted(p.msg_id for p in core.open_all(0.001)) == [2, 3]
    assert core.queue_depths() == {}


def test_bad_input_is_counted_not_fatal():
    core = create_core()
    core.submit(1, "r", Stage.REUSE, 0, 10, 0.0)
    core.submit(1, "r", Stage.REUSE, 0, 10, 0.0)
    core.submit(0, "r", Stage.REUSE, 0, 10, 0.0)
    core.complete(99, 0.0)
    assert core.stats["duplicate_submits"] == 1 and core.stats["bad_events"] == 1
    assert core.stats["unknown_completions"] == 1
    with pytest.raises(UserError, match="unknown port 'eth9'"):
        core.bind_handle(1, 1, "eth9")


def test_config_is_validated_once_with_clear_messages():
    with pytest.raises(UserError, match="at least one port"):
        CoreConfig(ports=())
    with pytest.raises(UserError, match="window_bytes"):
        CoreConfig(ports=(PortSpec("a", 1.0),), window_bytes=-1)
    with pytest.raises(UserError, match="rate must be"):
        PortSpec("a", 0)


def test_announced_batch_waiting_for_its_first_message_does_not_depart_on_idleness():
    # The cluster bug: a batch formed through the hooks computes for a while before its first message.
    # The idle rule (batch_idle = 1 s without messages) reported it departed, so the coordinator dropped
    # it and with it the sticky pruned set, about a second after pruning.
    core = create_core(batch_idle=1.0)
    core.register_request("big", deadline=5.0)
    core.batch_formed("b1", ["big"], 0.0, compute=0.01, traffic={"eth0": {"big": 5e9}})
    assert [r.kind for r in core.step(0.0).reports] == ["arrival"]
    for t in (0.5, 1.0, 1.5, 3.0, 5.5):
        assert core.step(t).reports == [], f"batch departed at t={t} before any message or its deadline"
    core.layer_begin("b1", 0, 5.5)
    core.submit(1, "big", Stage.P2D, 0, 1e6, 5.5)
    core.complete(1, 5.6)
    assert core.step(5.6).reports == []  # one message done is not the batch's end
    # Past every deadline and idle for batch_idle: the engine is gone; the batch departs.
    assert [r.kind for r in core.step(6.7).reports] == ["departure"]


def test_unannounced_batch_still_departs_after_batch_idle():
    core = create_core(batch_idle=1.0)
    core.submit(1, "r", Stage.P2D, 0, 1e6, 0.0)
    core.step(0.0)
    core.complete(1, 0.1)
    assert core.step(0.5).reports == []
    assert [r.kind for r in core.step(1.2).reports] == ["departure"]


def test_last_kv_write_after_compute_end_keeps_its_request_deadline():
    # Seen on the testbed: the engine says compute ended (layer_end(last=True)) before it submits the
    # last layer's KV write. The batch had no live message at that moment, so it departed, its request
    # records were dropped, and the write arrived as a request without a deadline: RLI's bottom level
    # (DSCP 32) instead of MLU's, and the request's TTFT ended on the slowest class of the fabric.
    core = create_core(batch_idle=1.0)
    core.register_request("r", deadline=0.2)
    core.batch_formed("b", ["r"], 0.0, compute=0.05)
    core.layer_begin("b", 0, 0.0)
    core.submit(1, "r", Stage.P2D, 0, 1e6, 0.01)
    assert [r.kind for r in core.step(0.01).reports] == ["arrival"]
    core.compute_done("b", 0.04)
    core.complete(1, 0.05)  # the batch's only live message ends after compute did
    assert core.step(0.05).reports == []  # not departed: its last KV write is still to come
    core.submit(2, "r", Stage.P2D, 1, 1e8, 0.06)
    core.step(0.06)
    flow = core.messages[2].flow
    assert flow.deadline == 0.2 and flow.batch == "b" and flow.has_explicit_deadline
    core.complete(2, 0.1)
    core.request_done("r", 0.1)
    assert [r.kind for r in core.step(0.1).reports] == ["departure"]


def test_formed_batch_waits_to_compute_layer_zero_so_its_first_read_is_rli_zero():
    # MFS appendix: L_curr is the layer "being computed or waiting to be computed". A formed batch
    # waits to compute layer 0, so its layer-0 KV read blocks compute now (RLI 0, level 1), and its
    # layer-2 read is two layers ahead -- before the first layer_begin arrives, as in the simulator.
    core = create_core()
    core.register_request("r1", deadline=1.0)
    core.batch_formed("b1", ["r1"], 0.0)
    core.submit(1, "r1", Stage.REUSE, 0, 1e6, 0.0)
    core.submit(2, "r1", Stage.REUSE, 2, 1e6, 0.0)
    out = core.step(0.0)
    assert granted(out) == [1]
    assert out.permits[0].level == 1 and out.permits[0].dscp == 38
    assert core.queue_depths() == {("eth0", 3): 1}
    # A read of a request in no formed batch still enters low: nothing says when it computes.
    core.submit(3, "r2", Stage.REUSE, 0, 1e6, 0.0)
    core.step(0.0)
    assert core.queue_depths() == {("eth0", 3): 1, ("eth0", 7): 1}


def test_a_port_with_its_own_window_classifies_without_holding():
    # A receive port: the remote switch port orders the bytes by DSCP, so the host holds nothing back there;
    # the send port keeps strict priority (the daemon's window, 0 here).
    core = DaemonCore(CoreConfig(ports=(PortSpec("eth0", GBPS100), PortSpec("eth0-rx", GBPS100, window=1e12)),
                                 window_bytes=0.0))
    core.register_request("r1", deadline=1.0)
    core.batch_formed("b1", ["r1"], 0.0)
    for msg, port in ((1, "eth0"), (2, "eth0"), (3, "eth0-rx"), (4, "eth0-rx")):
        core.submit(msg, "r1", Stage.REUSE, msg % 2 * 3, 1e6, 0.0, port=port)  # layers 3, 0, 3, 0
    out = core.step(0.0)
    assert sorted(granted(out)) == [2, 3, 4]  # eth0 holds the layer-3 read; eth0-rx grants both
    levels = {p.msg_id: p.level for p in out.permits}
    assert levels[4] < levels[3]  # each still in its own class


# ------------------------------------------------------------------ spare capacity

MS = 1e-3


def counted_core(**kw) -> DaemonCore:
    """One port with its own byte counter (the core only takes the samples it is given)."""
    return DaemonCore(CoreConfig(ports=(PortSpec("eth0", GBPS100, counter="tx_bytes"),), window_bytes=0.0, **kw))


def three_ranks(core: DaemonCore) -> None:
    """A collective (granted at once), then reads one and three layers ahead (held behind it)."""
    core.batch_formed("b1", ["r1"], 0.0)
    core.layer_begin("b1", 0, 0.0)
    core.submit(1, "r1", Stage.COLLECTIVE, 0, 1e9, 0.0)
    core.submit(2, "r1", Stage.REUSE, 1, 1e6, 0.0)
    core.submit(3, "r1", Stage.REUSE, 3, 1e6, 0.0)
    assert granted(core.step(0.0)) == [1]


def test_a_port_left_idle_by_a_granted_message_grants_the_next_rank_one_at_a_time():
    # The collective's 1 GB are granted but its bytes wait elsewhere (its peer's port): the port's own
    # counter shows it idle. Strict priority would hold both reads until the collective completes.
    core = counted_core()
    three_ranks(core)
    sent = 0.0
    core.port_counter("eth0", sent, 0.0)
    sent += GBPS100 * MS  # a busy millisecond: the collective at line rate
    core.port_counter("eth0", sent, 1 * MS)
    assert granted(core.step(1 * MS)) == []
    sent += 0.1 * GBPS100 * MS  # 10 % of the line rate: spare, but 1 ms is not the 2 ms stretch
    core.port_counter("eth0", sent, 2 * MS)
    assert granted(core.step(2 * MS)) == []
    core.port_counter("eth0", sent + 0.1 * GBPS100 * MS, 3 * MS)
    out = core.step(3 * MS)
    assert granted(out) == [2] and out.permits[0].spare  # the higher read only
    assert out.permits[0].level == 2  # in its own class: the switch still orders it below the collective
    sent += 0.2 * GBPS100 * MS
    # The next rank waits for a new 2 ms stretch, measured from that grant.
    core.port_counter("eth0", sent, 4 * MS)
    assert granted(core.step(4 * MS)) == []
    for t in (5, 6):
        sent += 0.75 * GBPS100 * MS  # exactly the line rate less the 25 % share: still spare
        core.port_counter("eth0", sent, t * MS)
    out = core.step(6 * MS)
    assert granted(out) == [3] and core.stats["spare_permits"] == 2


def test_a_busy_interval_or_a_grant_restarts_the_stretch_and_a_busy_port_holds():
    core = counted_core()
    three_ranks(core)
    core.port_counter("eth0", 0.0, 0.0)
    core.port_counter("eth0", 0.0, 1 * MS)  # spare
    core.port_counter("eth0", 0.8 * GBPS100 * MS, 2 * MS)  # 80 % busy: not spare (at most 75 % is)
    core.port_counter("eth0", 0.8 * GBPS100 * MS, 3 * MS)  # spare again, but only 1 ms of it
    assert granted(core.step(3 * MS)) == []
    # A strict grant (the collective completes, the first read goes) restarts the stretch too.
    core.port_counter("eth0", 0.8 * GBPS100 * MS, 4 * MS)  # 2 ms of spare now...
    core.complete(1, 4 * MS)  # ...but the strict rule grants first
    out = core.step(4 * MS)
    assert granted(out) == [2] and not out.permits[0].spare
    core.port_counter("eth0", 0.8 * GBPS100 * MS, 5 * MS)
    assert granted(core.step(5 * MS)) == []
    # At line rate nothing below goes until the read is done.
    busy = 0.8 * GBPS100 * MS
    for t in range(6, 20):
        busy += GBPS100 * MS
        core.port_counter("eth0", busy, t * MS)
        assert granted(core.step(t * MS)) == []
    assert core.stats["spare_permits"] == 0


@pytest.mark.parametrize("ports, share", [((PortSpec("eth0", GBPS100),), 0.25),  # no counter: load from completions
                                          ((PortSpec("eth0", GBPS100, counter="tx_bytes"),), None)])  # turned off
def test_without_a_counter_or_with_spare_share_null_the_rule_stays_strict(ports, share):
    core = DaemonCore(CoreConfig(ports=ports, window_bytes=0.0, spare_share=share))
    three_ranks(core)
    for t in range(10):
        core.port_counter("eth0", 0.0, t * MS)
        assert granted(core.step(t * MS)) == []


@pytest.mark.parametrize("kw, message", [({"spare_share": 0.0}, "spare_share must be"),
                                         ({"spare_share": 1.5}, "spare_share must be"),
                                         ({"spare_share": True}, "spare_share must be"),
                                         ({"spare_quiet": -1.0}, "spare_quiet must be"),
                                         ({"spare_burst": float("inf")}, "spare_burst must be")])
def test_spare_settings_are_checked(kw, message):
    with pytest.raises(UserError, match=message):
        CoreConfig(ports=(PortSpec("eth0", GBPS100),), **kw)


def saturated_counter(rate: float, seconds: float, seed: int = 3) -> list[tuple[float, float]]:
    """(time, tx_bytes) samples of a port sending at its line rate in 64 KiB GSO super-packets, each counted
    at once when the port's shaper takes it (every 64 KiB / rate, a little late at times), read every 1-1.3 ms
    as the daemon's loop reads it (a poll rounded up to whole milliseconds)."""
    rng = np.random.default_rng(seed)
    burst = 65536.0
    period = burst / rate
    taken = np.cumsum(period + rng.exponential(0.02 * period, int(seconds / period) + 1))
    samples, t = [], 0.0
    while t < seconds:
        samples.append((t, burst * float(np.searchsorted(taken, t, side="right"))))
        t += 1e-3 + rng.uniform(0.0, 3e-4)
    return samples


@pytest.mark.parametrize("burst, misfires", [(65536.0, False), (0.0, True)])
def test_a_saturated_port_counting_whole_super_packets_shows_no_spare_capacity(burst, misfires):
    # On the testbed (100 Mbit/s veths) a saturated port's counter jumps by a GSO super-packet every 5.2 ms
    # and stands still in between: two quiet 1-ms samples in a row happen (seen on the wire: up to 3.4 ms of
    # them in 10 s at line rate), so a stretch of 2 ms alone granted a read during a Mooncake write at
    # line rate. The stretch lasts at least one super-packet's time.
    rate = 100e6 / 8
    core = DaemonCore(CoreConfig(ports=(PortSpec("eth0", rate, counter="tx_bytes"),), window_bytes=0.0,
                                 spare_burst=burst))
    three_ranks(core)
    for t, sent in saturated_counter(rate, 10.0):
        core.port_counter("eth0", sent, t)
        core.step(t)
    assert (core.stats["spare_permits"] > 0) == misfires


def shim_only_requests(core: DaemonCore, n: int) -> float:
    """``n`` requests seen only through one shim message each, 10 ms apart (as a Mooncake job tags its
    transfers, never reporting a request done); returns the time after the last."""
    t = 0.0
    for i in range(n):
        core.submit(i + 1, f"mc-{i}", Stage.REUSE, 0, 1e5, t)
        core.step(t)
        core.complete(i + 1, t + 0.001)
        t += 0.01
        core.step(t)
    return t


def test_requests_seen_only_through_shim_events_are_forgotten_with_their_batch():
    # The soak: a Mooncake job tags its transfers with a new request key every few dozen transfers and
    # never says the request is done. Each key left a request record behind when its batch departed idle:
    # the daemon's memory grew with every request it ever saw.
    core = create_core(batch_idle=1.0)
    t = shim_only_requests(core, 2000)
    core.step(t + 2.0)
    assert core.batches == {} and core.requests == {}, f"{len(core.requests)} request records left"


def test_a_registered_request_is_kept_until_its_deadline_then_forgotten():
    core = create_core(batch_idle=1.0)
    core.register_request("r", deadline=10.0)  # registered; its batch forms later
    core.submit(1, "r", Stage.P2D, 0, 1e6, 0.0)
    core.step(0.0)
    core.complete(1, 0.1)
    core.step(2.0)  # its unannounced batch departs idle: the request still has a deadline ahead
    assert core.requests["r"].deadline == 10.0
    core.submit(2, "r", Stage.P2D, 1, 1e6, 3.0)
    assert core.messages[2].flow.deadline == 10.0  # its next message keeps the deadline
    core.complete(2, 3.1)
    core.step(5.0)
    core.step(11.5)  # past the deadline and idle: the engine never said done; forgotten
    assert "r" not in core.requests
    core.register_request("gone", deadline=1.0)  # registered, never a message, never done
    core.step(12.0)
    core.step(13.5)
    assert "gone" not in core.requests


def test_a_request_done_without_a_batch_leaves_no_record():
    core = create_core()
    for i in range(100):
        core.register_request(f"r{i}", deadline=5.0)
        core.request_done(f"r{i}", 0.1)
    assert core.requests == {}


def test_a_message_never_completed_expires_and_stops_holding_the_port():
    # A job killed between its SUBMIT and its COMPLETION (or a COMPLETION dropped on a full ring)
    # left the message live forever: its granted bytes held every lower level behind the window.
    core = create_core(message_ttl=60.0)
    core.submit(1, "a", Stage.COLLECTIVE, 0, 1e9, 0.0)
    assert granted(core.step(0.0)) == [1]
    core.submit(2, "b", Stage.REUSE, 5, 1e6, 1.0)
    assert granted(core.step(1.0)) == []  # behind the collective's bytes
    assert granted(core.step(59.0)) == []
    result = core.step(60.5)
    assert 1 not in core.messages and core.stats["expired_messages"] == 1
    assert 1 in result.cleared and granted(result) == [2]


def test_every_departed_batch_is_forgotten_by_the_policy():
    # The soak: MfsPolicy's batch and request tables grew by one entry per request the daemon ever saw.
    # The policy frees them on forget() (tests/policy/test_mfs_forget.py); the daemon must call it.
    core = create_core(batch_idle=1.0)
    forgotten: list[str] = []
    real = core.policy.forget
    core.policy.forget = lambda batches: (forgotten.extend(batches), real(batches))
    t = shim_only_requests(core, 300)
    core.register_request("r", deadline=t + 5)
    core.batch_formed("b", ["r"], t, compute=0.01)
    core.submit(1000, "r", Stage.P2D, 0, 1e6, t)
    core.step(t)
    core.complete(1000, t + 0.01)
    core.request_done("r", t + 0.01)
    core.step(t + 2.0)
    assert sorted(forgotten) == sorted([f"mc-{i}" for i in range(300)] + ["b"])
