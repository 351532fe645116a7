"""The engine's rates from the allocator's C path (inside the C flow table)
and from its NumPy path give the same run bit for bit: every finish time,
every decision's snapshot, the bytes per stage and the link-load average."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Decision, Flow, FlowPolicy, Snapshot, Stage
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, allocator, leaf_spine

STAGES = list(Stage)


class Mixed(FlowPolicy):
    """Three levels by a flow's own seed, a cap on some, a timer now and then;
    records what it reads so runs can be compared."""

    name = "test-mixed"

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def decide(self, snap: Snapshot) -> Decision:
        seeds = [f.state["seed"] for f in snap.flows]
        level = np.array([(s + int(snap.now * 1e4)) % 3 for s in seeds], dtype=np.int64)
        cap = np.array([2e8 if s % 5 == 0 else np.inf for s in seeds])
        self.seen.append((snap.now, snap.remaining.tolist(), snap.link_load[snap.link_load > 0].tolist(),
                          snap.size.tolist(), snap.bottleneck_rate.tolist(), snap.stage.tolist()))
        timers = (snap.now + 3e-5,) if len(seeds) % 4 == 0 else ()
        return self.decision(level, cap=cap, timers=timers)


def run(native: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(allocator, "NATIVE", native and allocator.NATIVE)
    rng = np.random.default_rng(3)
    topo = leaf_spine(64, 8, 1e9, oversubscription=2.0)
    policy = Mixed()
    net = FluidNetwork(topo, policy)
    flows = []
    t = 0.0
    for i in range(400):
        t += float(rng.exponential(1.5e-6))
        src = int(rng.integers(0, 64))
        dst = (src + int(rng.integers(1, 64))) % 64
        flow = Flow.on_path(f"f{i}", float(rng.exponential(2e4) + 100), topo.path(src, dst), arrival=t,
                            stage=STAGES[i % 3])
        flow.state["seed"] = i
        flows.append(flow)
        net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    net.run()
    return ([f.finish for f in flows], policy.seen, dict(net.bytes_delivered_by_stage), net.link_load.tolist(),
            net.events)


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
def test_engine_paths_give_the_same_run(monkeypatch):
    reference = run(True, monkeypatch)
    assert max(len(s[1]) for s in reference[1]) > 12  # some decisions see many flows
    assert any(s[2] for s in reference[1])  # the link load moved
    assert run(False, monkeypatch) == reference


class Sparse(Mixed):
    """Mixed without reading the link load: the engine then allocates one live
    flow without the allocator (its bottleneck rate, capped, or its kept rate)."""

    name = "test-sparse"
    reads_link_load = False

    def decide(self, snap: Snapshot) -> Decision:
        seeds = [f.state["seed"] for f in snap.flows]
        level = np.array([(s + int(snap.now * 1e4)) % 3 for s in seeds], dtype=np.int64)
        cap = np.array([2e8 if s % 5 == 0 else np.inf for s in seeds])
        self.seen.append((snap.now, snap.remaining.tolist()))
        return self.decision(level, cap=cap)


def run_sparse(track: bool) -> tuple:
    rng = np.random.default_rng(11)
    topo = leaf_spine(16, 4, 1e9, oversubscription=2.0)
    policy = Sparse()
    net = FluidNetwork(topo, policy, track_link_load=track)
    flows = []
    t = 0.0
    for i in range(300):
        t += float(rng.exponential(4e-5))  # about one flow alive at a time, sometimes a few
        src = int(rng.integers(0, 16))
        flow = Flow.on_path(f"f{i}", float(rng.exponential(2e4) + 100), topo.path(src, (src + 1 + i % 15) % 16),
                            arrival=t, stage=STAGES[i % 3])
        flow.state["seed"] = i
        flows.append(flow)
        net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    net.run()
    return [f.finish for f in flows], policy.seen, dict(net.bytes_delivered_by_stage), net.events


def test_one_live_flow_rates_equal_the_allocators():
    """Keeping the link load (which sends every allocation to the allocator)
    changes nothing: the one-flow shortcut gives the allocator's rates."""
    fast = run_sparse(track=False)
    assert sum(1 for s in fast[1] if len(s[1]) == 1) > 100  # the shortcut ran
    assert sum(1 for s in fast[1] if len(s[1]) > 1) > 10
    assert fast == run_sparse(track=True)
