"""The simulator's model of the contention scenario (the testbed's prediction): its pieces on hand-checked cases."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from laxflow.sim.events import EventQueue, Priority
from laxflow.testbed import sim_model as sm
from laxflow.testbed import sim_wire as sw
from laxflow.testbed.decision_trace import summarize, summarize_holds
from laxflow.testbed.fabric import parse_rate
from laxflow.testbed.scenario import ScenarioConfig
from laxflow.testbed.sim_model import GOODPUT, ModelParams, low_load_ttft, predict, predict_modes

CFG = ScenarioConfig(requests=4)
G = parse_rate(CFG.rate) / 8 * GOODPUT  # payload bytes/s of one link


R = parse_rate(CFG.rate) / 8  # line rate, bytes/s: HTB's rate
T = (sm.MSS + sw.HEADERS) / R  # one full frame's time at the line rate


def _wire(burst: float = 0.0) -> tuple[EventQueue, sw.Wire]:
    q = EventQueue()
    return q, sw.Wire(q, 4, R, burst)


def _flat(m: sm._Model) -> None:
    """No HTB burst on the model's ports: every frame after the first waits its line-rate time (hand-checkable)."""
    for p in m.wire.ports:
        p.burst = p.tokens = 0.0


def test_a_port_is_strict_priority_by_traffic_class_and_fifo_inside_one() -> None:
    q, w = _wire()
    done: dict[str, float] = {}
    for name, tc in (("lo1", 0), ("hi", 4), ("lo2", 0)):  # all written at t = 0 on h0's egress
        w.send(0, 1, 10 * sm.MSS, tc, lambda n=name: done.setdefault(n, q.now))
    q.run()
    # one frame leaves per frame time; a message is in when its last frame leaves the switch port
    # lo1's first frame went before hi arrived (HTB never pre-empts a sent packet), then hi's ten, then lo1, lo2
    assert done["hi"] == pytest.approx(10 * T)
    assert done["lo1"] == pytest.approx(19 * T) and done["lo2"] == pytest.approx(29 * T)


def test_the_switch_port_drains_its_backlog_while_the_senders_pause() -> None:
    # h0 and h1 each write 10 frames to h3 (TC 2); at 5 T both start an all_to_all (TC 4) that pre-empts the
    # writes at their hosts. h3's switch port got 2 frames per T and sends 1: it keeps sending its backlog.
    q, w = _wire()
    for src in (0, 1):
        w.send(src, 3, 10 * sm.MSS, 2, lambda: None)
        q.push(4.5 * T, Priority.ARRIVAL, w.send, src, 1 - src, 10 * sm.MSS, 4, lambda: None)
    down = w.ports[w.link("h3-down")]
    q.run(until=9.5 * T)
    assert down.tx == pytest.approx(10 * (sm.MSS + sw.HEADERS))  # busy through 9 T: 5 frames from its buffer
    assert w.ports[w.link("h0-up")].tx == pytest.approx(10 * (sm.MSS + sw.HEADERS))  # 5 writes, then 5 of the a2a
    q.run()
    assert down.tx == pytest.approx(20 * (sm.MSS + sw.HEADERS))


def test_an_idle_port_lets_its_htb_burst_through_then_paces_and_gso_packets_go_whole() -> None:
    burst = sw.htb_burst(parse_rate(CFG.rate))
    assert burst == 15000  # the fabric's tree: max(15000, ~1 ms at the line rate)
    frame = sm.MSS + sw.HEADERS
    q, w = _wire(burst)
    got: list[float] = []
    w.send(0, 1, 20 * sm.MSS, 0, lambda: got.append(q.now))
    q.run()
    # 10 frames while the bucket is not in debt (15000 - 9 * 1514 >= 0), then one per frame time
    assert got[0] == pytest.approx((10 * frame - burst) / R + 9 * T)
    # a GSO super-packet of 10 segments is sent whole and costs 10 frames; the veth counts its headers once
    q, w = _wire(burst)
    w.send(0, 1, 30 * sm.MSS, 0, lambda: got.append(q.now), skb=10 * sm.MSS)
    q.run()
    assert got[1] == pytest.approx((2 * 10 * frame - burst) / R)
    assert w.counter(w.link("h0-up")) == pytest.approx(3 * (10 * sm.MSS + sw.HEADERS))


def test_window_bound_connections_interleave_in_one_fifo() -> None:
    # two connections h0 -> h1 in one class, 100 frames each written at once: unbounded, the second waits for
    # the whole first message (FIFO); with a 10-segment window each, their frames alternate in the queue
    done: dict[str, float] = {}
    for windows in (None, (sw.Window(10), sw.Window(10))):
        q, w = _wire()
        for i, name in enumerate(("a", "b")):
            win = None if windows is None else windows[i]
            w.send(0, 1, 100 * sm.MSS, 0, lambda n=name, k=windows is None: done.setdefault(n + "fifo" * k, q.now),
                   window=win)
        q.run()
    assert done["afifo"] == pytest.approx(99 * T) and done["bfifo"] == pytest.approx(199 * T)
    assert done["a"] > 180 * T and done["b"] == pytest.approx(done["a"], abs=12 * T)


def test_acks_queued_behind_data_slow_a_window_bound_sender() -> None:
    # a KV read h2 -> h0 (window 10) while h0 sends a bulk message: ACKs in the bulk's class wait behind it
    got: dict[int, float] = {}
    for ack_tc in (0, 5):
        q, w = _wire()
        w.send(0, 1, 300 * sm.MSS, 0, lambda: None)
        w.send(2, 0, 100 * sm.MSS, 0, lambda a=ack_tc: got.setdefault(a, q.now), window=sw.Window(10), ack_tc=ack_tc)
        q.run()
    assert got[5] < 105 * T  # ACKs in a higher class: the read is hardly slowed (HTB never pre-empts a packet)
    assert got[0] > 250 * T  # ACKs behind the bulk data: ~one window per drained bulk queue


def test_static_all_to_all_is_its_time_alone_and_pays_the_overhead_once() -> None:
    # static, tiny reads and writes: stage 2 is alone on its ports, so every CCT is the model's a2a alone
    # (plus at most the peer's ACKs, which share the reverse direction's class queue: 66 bytes per packet)
    cfg = replace(CFG, reuse_bytes=10, kv_bytes=10)
    alone, acks = sm.alone_s(cfg, 2, probe=False), math.ceil(cfg.a2a_bytes / sm.MSS) * sw.ACK_FRAME / R
    cct = predict(cfg, "static", slo=1.0)["cct_mean"]
    assert alone <= cct <= alone + acks
    p = ModelParams(overhead_s={1: 0.0, 2: 0.004, 3: 0.0})
    assert predict(cfg, "static", p, slo=1.0)["cct_mean"] == pytest.approx(cct + 0.004, abs=1e-9)


def test_a_connection_keeps_its_order_and_back_to_back_messages_pay_no_overhead() -> None:
    m = sm._Model(CFG, "off", ModelParams(overhead_s={1: 0.0, 2: 0.0, 3: 0.005}), slo=1.0)
    _flat(m)
    got: list[tuple[str, float]] = []
    conn = m.dec_conn[0]
    conn.send(10 * sm.MSS, 0, lambda: got.append(("a", m.q.now)))
    conn.send(20 * sm.MSS, 0, lambda: got.append(("b", m.q.now)))
    m.q.run()
    assert [k for k, _ in got] == ["a", "b"]
    assert got[0][1] == pytest.approx(0.005 + 9 * T)
    assert got[1][1] == pytest.approx(0.005 + 29 * T)  # right behind "a": no second overhead


def test_sendall_returns_after_its_measured_time_and_a_class_switch_waits_for_the_drain() -> None:
    p = ModelParams(sendall_s={1: 0.0, 2: 0.0, 3: 0.001})
    m = sm._Model(CFG, "off", p, slo=1.0)
    _flat(m)
    got: dict[str, float] = {}
    conn = m.dec_conn[0]
    n = 10 * sm.MSS
    conn.send(n, 34, lambda: got.setdefault("a in", m.q.now), lambda: got.setdefault("a sent", m.q.now))
    conn.send(n, 34, lambda: got.setdefault("b in", m.q.now), lambda: got.setdefault("b sent", m.q.now))
    conn.send(n, 38, lambda: got.setdefault("c in", m.q.now), lambda: got.setdefault("c sent", m.q.now))
    m.q.run()
    assert got["a sent"] == got["b sent"] == pytest.approx(0.001)  # the socket buffer takes both at once
    assert got["a in"] == pytest.approx(9 * T) and got["b in"] == pytest.approx(19 * T)
    # c changes the connection's class: its send waits until a and b are in (wait_drained)
    assert got["c sent"] == pytest.approx(19 * T + 0.001) and got["c in"] == pytest.approx(29 * T)


def test_negative_overhead_is_delivered_at_once_and_only_on_an_empty_path() -> None:
    p = ModelParams(overhead_s={1: 0.0, 2: -0.002, 3: 0.0})
    times: dict[str, float] = {}
    for name, params in (("plain", ModelParams()), ("burst", p)):
        m = sm._Model(CFG, "off", params, slo=1.0)
        m.a2a_conn[0].send(50 * sm.MSS, 0, lambda n=name, m=m: times.setdefault(n, m.q.now))
        m.q.run()
    assert times["burst"] == pytest.approx(times["plain"] - 0.002, abs=T)  # 2 ms of its bytes at once
    for name, params in (("shared plain", ModelParams()), ("shared burst", p)):
        m = sm._Model(CFG, "off", params, slo=1.0)
        m.dec_conn[0].send(1e6, 0, lambda: None)  # a KV write on h0's egress: the path is not empty
        m.a2a_conn[0].send(50 * sm.MSS, 0, lambda n=name, m=m: times.setdefault(n, m.q.now))
        m.q.run()
    assert times["shared burst"] == times["shared plain"]


def test_a_daemon_reads_its_own_ports_wire_counters() -> None:
    # 14480 payload bytes h0 -> h3: h0's tx counter sees 10 full frames, h3's tx (ACKs) one ACK per packet
    m = sm._Model(CFG, "on", ModelParams(), slo=1.0)
    m.start_flow(0, 3, 14480.0, 0, 3, lambda: None)
    m.q.run(until=1.0)
    assert m.counter(m.link("h0-up")) == pytest.approx(14480 / GOODPUT) == pytest.approx(10 * 1514)
    assert m.counter(m.link("h3-down")) == pytest.approx(10 * 1514)
    assert m.counter(m.link("h3-up")) == m.counter(m.link("h0-down")) == pytest.approx(10 * sw.ACK_FRAME)
    assert m.counter(m.link("h1-up")) == 0.0
    d = m.daemons[0]
    d.sample()
    m.q.run(until=1.01)  # the tick samples every counter interval; h0 sent nothing since
    assert d.core.meter.loads()[0] == pytest.approx(0.0)


def test_on_mode_permit_latency_lands_on_the_all_to_all_and_messages_carry_permit_classes() -> None:
    # far-apart requests, tiny reads and writes: the all_to_all is the top rank on eth0, never held,
    # so its CCT is the permit latency plus its bytes at goodput
    cfg = replace(CFG, reuse_bytes=10, kv_bytes=10, interarrival_ms=1000.0)
    p = ModelParams().with_permits({"1": 2.0, "2": 1.5, "3": 9.0}, "test")
    assert p.permit_s == {1: 0.002, 2: 0.0015, 3: 0.0015}  # stage 3: stage 2's latency (same port and path)
    out = predict(cfg, "on", p, slo=1.0)
    alone, acks = sm.alone_s(cfg, 2, probe=False), math.ceil(cfg.a2a_bytes / sm.MSS) * sw.ACK_FRAME / R
    assert 0.0015 + alone <= out["cct_mean"] <= 0.0015 + alone + acks
    assert out["permit_wait_ms_prefill"]["1"] == pytest.approx(2.0)  # reads: eth0-rx never holds
    assert out["permit_wait_ms_prefill"]["2"] == pytest.approx(1.5, rel=1e-3)
    total = cfg.requests + cfg.warmup
    assert sum(v for k, v in out["permit_dscp_prefill"].items() if k.startswith("s2:")) == 2 * total * cfg.layers
    # layer 0's read blocks the layer about to compute (RLI 0): the top RMLQ level's neighbour, DSCP 38
    assert out["permit_dscp_prefill"]["s1:38"] == 2 * total


def test_the_decision_trace_records_each_kv_write_at_its_permit() -> None:
    out = predict(CFG, "on", slo=0.75, trace=True)
    recs = out["decisions"]
    total = CFG.requests + CFG.warmup
    assert len(recs) == 2 * total * CFG.layers == len({(r["node"], r["msg"]) for r in recs})
    writes = {k[3:]: v for k, v in out["permit_dscp_prefill"].items() if k.startswith("s3:")}
    assert summarize(recs)["dscp"] == writes  # the recorded decision is the one the permit carried
    for r in recs:
        assert r["rho"] == pytest.approx(min(max(r["link_load"] - r["explicit_load"], 0.0), 1.0))
        assert r["mlu"] == pytest.approx(r["bytes_left"] / (r["time_left"] * R * (1 - r["rho"])))
    assert "decisions" not in predict(CFG, "on", slo=0.75)


def test_slo_is_the_factor_times_the_low_load_ttft_and_the_modes_finish() -> None:
    low = low_load_ttft(CFG)
    assert CFG.ideal_ttft_s() <= low  # the sizes' bound ignores the ranks sharing the KV and decode ports
    out = predict_modes(CFG, modes=("off", "static", "on"))
    for mode in ("off", "static", "on"):
        assert out[mode]["slo_s"] == pytest.approx(CFG.slo_factor * low)
        assert 0 <= out[mode]["slo_attainment"] <= 1 and out[mode]["ttft_mean"] > 0
    assert out["off"]["cct_mean"] > CFG.a2a_bytes / G * 1.05  # one class: reads and writes share its links
    assert predict_modes(CFG, slo=1.5)["on"]["slo_s"] == 1.5


def test_a_seed_draws_compute_and_overheads_from_the_measured_samples() -> None:
    p = ModelParams(compute_s=0.015, compute_samples_s=(0.015, 0.030),
                    overhead_samples_s={1: (0.0,), 2: (0.0, 0.004), 3: (0.0,)})
    mean = predict(CFG, "static", p, slo=1.0)
    a, b = predict(CFG, "static", p, slo=1.0, seed=3), predict(CFG, "static", p, slo=1.0, seed=3)
    assert a["ttft_per_request"] == b["ttft_per_request"]  # deterministic for a seed
    assert a["compute_s"] == mean["compute_s"] == 0.015  # the reported mean stays the measured one
    assert a["ttft_mean"] > mean["ttft_mean"] and a["cct_mean"] > mean["cct_mean"]  # the draws only add here
    assert predict(CFG, "static", replace(p, compute_samples_s=(), overhead_samples_s=None), slo=1.0,
                   seed=3)["ttft_per_request"] == mean["ttft_per_request"]  # no samples: a seed changes nothing


def test_model_params_are_validated() -> None:
    with pytest.raises(ValueError, match="overhead_s"):
        ModelParams(overhead_s={1: 0.0, 2: float("inf"), 3: 0.0})
    with pytest.raises(ValueError, match="sendall_s"):
        ModelParams(sendall_s={1: 0.0, 2: -1.0, 3: 0.0})
    with pytest.raises(ValueError, match="permit_s"):
        ModelParams(permit_s={1: 0.0, 2: 0.0})
    with pytest.raises(ValueError, match="compute_s"):
        ModelParams(compute_s=float("nan"))
    with pytest.raises(ValueError, match="window_segments"):
        ModelParams(window_segments={1: 10, 2: 0, 3: 10})
    with pytest.raises(ValueError, match="skb_bytes"):
        ModelParams(skb_bytes={1: 0.0, 2: 1448, 3: 1448})
    with pytest.raises(ValueError, match="mode"):
        predict(CFG, "fs")
    assert np.isfinite(predict(CFG, "off", slo=1.0)["cct_mean"])


def _read_in(mode: str, backlog_segments: int) -> float:
    """When rank 0's layer-0 read is in, asked while the rank's own host queue holds a bulk message."""
    m = sm._Model(CFG, mode, ModelParams(), slo=1.0)
    _flat(m)
    if backlog_segments:
        m.a2a_conn[0].send(backlog_segments * sm.MSS, 0, lambda: None)  # class 0 at rank 0's egress
    rank = sm._Rank(m, 0)
    rank.req, rank.layer, rank.read_in, rank.computing = 0, 0, [False] * CFG.layers, True  # (no compute follows)
    m.q.push(2 * T, Priority.ARRIVAL, rank._ask, 0, 0, None)  # once the backlog's frames are in the queue
    m.q.run()
    return m.timeline[("read", 0, 0)][0] + m.arrivals[0] - 2 * T


def test_a_reads_request_crosses_the_fabric_in_the_ask_class() -> None:
    # off: the request (class 0) waits behind the rank's own queued bytes before the kvstore can answer;
    # static: the asking sides are in the top class and the request passes them
    alone = _read_in("off", 0)
    assert _read_in("off", 200) > alone + 150 * T
    assert _read_in("static", 200) < alone + 50 * T  # (at most the GSO packet on the wire: HTB never pre-empts)
    # and the request itself is on the path: later than the response's bytes alone
    assert alone > sm.alone_s(CFG, 1, probe=False)


def _acked(mode: str, backlog_segments: int) -> float:
    """When rank 0's write of layer 0 counts as acknowledged, with bulk bytes queued at the rank's switch port
    (a read's and the peer's all_to_all at once, each at line rate: the port's queue grows)."""
    m = sm._Model(CFG, mode, ModelParams(), slo=1.0)
    _flat(m)
    rank = sm._Rank(m, 0)
    rank.req = 0
    rank._write(0, 0, 0, None)
    for conn in (m.kv_conn[0], m.a2a_conn[1]) if backlog_segments else ():
        m.q.push(10 * T, Priority.ARRIVAL, conn.send, backlog_segments * sm.MSS, 0, lambda: None)
    m.q.run()
    return m.timeline[("acked", 0, 0)][0] + m.arrivals[0]


def test_a_writes_acknowledgement_comes_back_before_it_counts() -> None:
    # off: the decode host's acknowledgement (class 0) waits at the rank's switch port behind a read's bytes;
    # static: it passes them (the acknowledging sides are in the top class)
    alone = _acked("off", 0)
    assert alone >= sm.alone_s(CFG, 3, probe=False)
    assert _acked("off", 200) > alone + 100 * T
    assert _acked("static", 200) < alone + 50 * T


def _a2a_done(backlog_segments: int) -> list[float]:
    """When each rank's layer-0 all_to_all ends (from its start), with rank 0's host queue holding a bulk
    message in class 0 ("off") when the exchange starts."""
    m = sm._Model(CFG, "off", ModelParams(), slo=1.0)
    _flat(m)
    if backlog_segments:
        m.dec_conn[0].send(backlog_segments * sm.MSS, 0, lambda: None)  # rank 0's egress, class 0
    ranks = [sm._Rank(m, r) for r in (0, 1)]
    for r in ranks:
        r.req, r.layer, r.read_in, r.computing = 0, 0, [False] * CFG.layers, True  # (no compute follows)
        m.q.push(2 * T, Priority.ARRIVAL, r._computed, 0)
    m.q.run()
    return [m.timeline[("a2a", r, 0)][0] + m.arrivals[0] - 2 * T for r in (0, 1)]


def test_a_rank_ends_its_all_to_all_once_its_sendall_returned_and_the_peers_bytes_are_in() -> None:
    # as the worker does (a sender thread's sendall, then the peer's bytes drained): rank 0's own bytes
    # still queued behind its backlog do not hold rank 0, only rank 1, which waits for them
    alone = _a2a_done(0)
    late = _a2a_done(200)
    assert late[1] > alone[1] + 150 * T
    assert late[0] < alone[0] + 5 * T


def test_the_decision_trace_records_what_held_each_collective_at_the_gate() -> None:
    out = predict(CFG, "on", slo=0.75, trace=True)
    holds = out["a2a_holds"]
    total = CFG.requests + CFG.warmup
    assert len(holds) == 2 * total * CFG.layers == len({(h["node"], h["msg"]) for h in holds})  # each once
    for h in holds:
        assert h["submitted"] <= h["t"] <= h["granted"]  # taken in, decided, then permitted
        assert not h["spare"] or h["ahead"]  # a spare-capacity grant is one with something above it
        for a in h["ahead"]:  # only unfinished messages, ranked above it: never another collective of the port
            assert a["bytes"] > 0 and a["stage"] in (1, 3)
    s = summarize_holds(holds)
    assert s["collectives"] == len(holds) and 0 <= s["waited_1ms"] <= len(holds)
    assert s["wait_ms"]["p50"] <= s["wait_ms"]["p90"] <= s["wait_ms"]["max"]
    waited = [h for h in holds if h["granted"] - h["submitted"] >= 0.001]
    assert s["waited_1ms_nothing_ahead"] == sum(not h["ahead"] for h in waited)
    assert "a2a_holds" not in predict(CFG, "on", slo=0.75)


def test_summarize_holds_counts_what_was_ahead_of_the_collectives_that_waited() -> None:
    write = {"stage": 3, "queue": 0, "bytes": 250e3, "granted": True}
    read = {"stage": 1, "queue": 1, "bytes": 200e3, "granted": False}
    holds = [{"submitted": 0.0, "t": 0.0001, "granted": 0.0002, "ahead": []},
             {"submitted": 1.0, "t": 1.0001, "granted": 1.030, "spare": True, "ahead": [write, read]},
             {"submitted": 2.0, "t": 2.0001, "granted": 2.002, "ahead": []},
             {"submitted": 3.0, "t": 3.0001, "granted": None, "ahead": [write]}]
    s = summarize_holds(holds)
    assert s["collectives"] == 4 and s["waited_1ms"] == 2 and s["spare_grants"] == 1
    assert s["waited_1ms_granted_write_ahead"] == 1 and s["waited_1ms_granted_read_ahead"] == 0  # the read waited
    assert s["waited_1ms_nothing_ahead"] == 1
    assert s["wait_ms"]["max"] == pytest.approx(30.0) and s["wait_ms"]["p50"] == pytest.approx(2.0)
    assert summarize_holds([]) == {"collectives": 0, "spare_grants": 0}
