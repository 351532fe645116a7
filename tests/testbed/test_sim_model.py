"""The simulator's model of the contention scenario (the testbed's prediction): its pieces on hand-checked cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from laxflow.policy.flow import Flow
from laxflow.sim.events import EventQueue
from laxflow.sim.network.engine import FluidNetwork
from laxflow.sim.network.topology import Topology
from laxflow.testbed import sim_model as sm
from laxflow.testbed.fabric import parse_rate
from laxflow.testbed.scenario import ScenarioConfig
from laxflow.testbed.sim_model import GOODPUT, ModelParams, low_load_ttft, predict, predict_modes

CFG = ScenarioConfig(requests=4)
G = parse_rate(CFG.rate) / 8 * GOODPUT  # payload bytes/s of one link


def test_wire_classes_is_strict_priority_by_traffic_class_and_fair_inside_one() -> None:
    # one link of 1000 B/s; DSCP 38 (TC 4) beats DSCP 0 (TC 0); two DSCP-0 flows share
    topo = Topology.from_links(["l"], [1000.0])
    q = EventQueue()
    net = FluidNetwork(topo, sm.WireClasses(), q)
    done: dict[str, float] = {}
    for fid, tc in (("hi", sm._TC[38]), ("lo1", 0), ("lo2", 0)):
        f = Flow.on_path(fid, 1000.0, [0])
        f.state["tc"] = tc
        net.add_flow(f, lambda f: done.__setitem__(f.id, q.now))
    q.run()
    assert done["hi"] == pytest.approx(1.0)  # alone on the link first
    assert done["lo1"] == pytest.approx(3.0) and done["lo2"] == pytest.approx(3.0)  # then half each


def test_static_all_to_all_has_its_link_and_pays_the_overhead_once() -> None:
    # static: stage 2 is the top class on both its links, so every CCT is its bytes at goodput,
    # plus the measured overhead of a message that finds its connection idle (every layer's does)
    exact = CFG.a2a_bytes / G
    assert predict(CFG, "static", slo=1.0)["cct_mean"] == pytest.approx(exact, rel=1e-9)
    p = ModelParams(overhead_s={1: 0.0, 2: 0.004, 3: 0.0})
    assert predict(CFG, "static", p, slo=1.0)["cct_mean"] == pytest.approx(exact + 0.004, rel=1e-9)


def test_a_connection_is_fifo_and_back_to_back_messages_pay_no_overhead() -> None:
    m = sm._Model(CFG, "off", ModelParams(overhead_s={1: 0.0, 2: 0.0, 3: 0.005}), slo=1.0)
    got: list[tuple[str, float]] = []
    conn = m.dec_conn[0]
    conn.send(1000.0, 0, lambda: got.append(("a", m.q.now)))
    conn.send(2000.0, 0, lambda: got.append(("b", m.q.now)))
    m.q.run()
    assert [k for k, _ in got] == ["a", "b"]
    assert got[0][1] == pytest.approx(0.005 + 1000 / G)
    assert got[1][1] == pytest.approx(0.005 + 3000 / G)  # right behind "a": no second overhead


def test_sendall_returns_after_its_measured_time_and_a_class_switch_waits_for_the_drain() -> None:
    p = ModelParams(sendall_s={1: 0.0, 2: 0.0, 3: 0.001})
    m = sm._Model(CFG, "off", p, slo=1.0)
    got: dict[str, float] = {}
    conn = m.dec_conn[0]
    conn.send(1000.0, 34, lambda: got.setdefault("a in", m.q.now), lambda: got.setdefault("a sent", m.q.now))
    conn.send(1000.0, 34, lambda: got.setdefault("b in", m.q.now), lambda: got.setdefault("b sent", m.q.now))
    conn.send(1000.0, 38, lambda: got.setdefault("c in", m.q.now), lambda: got.setdefault("c sent", m.q.now))
    m.q.run()
    assert got["a sent"] == got["b sent"] == pytest.approx(0.001)  # the socket buffer takes both at once
    assert got["a in"] == pytest.approx(1000 / G) and got["b in"] == pytest.approx(2000 / G)
    # c changes the connection's class: its send waits until a and b are in (wait_drained)
    assert got["c sent"] == pytest.approx(2000 / G + 0.001) and got["c in"] == pytest.approx(3000 / G)


def test_negative_overhead_is_the_idle_paths_burst_and_only_an_idle_path_gets_it() -> None:
    p = ModelParams(overhead_s={1: 0.0, 2: -0.002, 3: 0.0})
    m = sm._Model(CFG, "off", p, slo=1.0)
    got: dict[str, float] = {}
    m.a2a_conn[0].send(50_000.0, 0, lambda: got.setdefault("alone", m.q.now))
    m.q.run()
    assert got["alone"] == pytest.approx(50_000 / G - 0.002)
    # the same message while a KV write uses h0's egress: no burst, it shares the link
    m = sm._Model(CFG, "off", p, slo=1.0)
    m.dec_conn[0].send(1e6, 0, lambda: None)
    m.a2a_conn[0].send(50_000.0, 0, lambda: got.setdefault("shared", m.q.now))
    m.q.run()
    assert got["shared"] == pytest.approx(2 * 50_000 / G)


def test_a_daemon_reads_its_own_ports_wire_counters() -> None:
    # 14480 payload bytes h0 -> h3: h0's tx counter sees 10 full frames, h3's tx (ACKs) 5 ACK frames
    m = sm._Model(CFG, "on", ModelParams(), slo=1.0)
    m.start_flow(0, 3, 14480.0, 0, 3, lambda: None)
    m.q.run(until=0.0)
    assert m.counter(m.link("h0-up")) == 0.0
    m.q.run(until=1.0)
    assert m.counter(m.link("h0-up")) == pytest.approx(14480 / GOODPUT) == pytest.approx(10 * 1514)
    assert m.counter(m.link("h3-down")) == pytest.approx(10 * 1514)
    assert m.counter(m.link("h3-up")) == pytest.approx(5 * sm.ACK_FRAME)
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
    assert out["cct_mean"] == pytest.approx(0.0015 + cfg.a2a_bytes / G, rel=1e-3)
    assert out["permit_wait_ms_prefill"]["1"] == pytest.approx(2.0)  # reads: eth0-rx never holds
    assert out["permit_wait_ms_prefill"]["2"] == pytest.approx(1.5, rel=1e-3)
    total = cfg.requests + cfg.warmup
    assert sum(v for k, v in out["permit_dscp_prefill"].items() if k.startswith("s2:")) == 2 * total * cfg.layers
    # layer 0's read blocks the layer about to compute (RLI 0): the top RMLQ level's neighbour, DSCP 38
    assert out["permit_dscp_prefill"]["s1:38"] == 2 * total


def test_slo_is_the_factor_times_the_low_load_ttft_and_the_modes_finish() -> None:
    low = low_load_ttft(CFG)
    assert CFG.ideal_ttft_s() <= low  # the sizes' bound ignores the ranks sharing the KV and decode ports
    out = predict_modes(CFG, modes=("off", "static", "on"))
    for mode in ("off", "static", "on"):
        assert out[mode]["slo_s"] == pytest.approx(CFG.slo_factor * low)
        assert 0 <= out[mode]["slo_attainment"] <= 1 and out[mode]["ttft_mean"] > 0
    assert out["off"]["cct_mean"] > CFG.a2a_bytes / G * 1.05  # one class: reads and writes share its links
    assert predict_modes(CFG, slo=1.5)["on"]["slo_s"] == 1.5


def test_model_params_are_validated() -> None:
    with pytest.raises(ValueError, match="overhead_s"):
        ModelParams(overhead_s={1: 0.0, 2: float("inf"), 3: 0.0})
    with pytest.raises(ValueError, match="sendall_s"):
        ModelParams(sendall_s={1: 0.0, 2: -1.0, 3: 0.0})
    with pytest.raises(ValueError, match="permit_s"):
        ModelParams(permit_s={1: 0.0, 2: 0.0})
    with pytest.raises(ValueError, match="compute_s"):
        ModelParams(compute_s=float("nan"))
    with pytest.raises(ValueError, match="mode"):
        predict(CFG, "fs")
    assert np.isfinite(predict(CFG, "off", slo=1.0)["cct_mean"])
