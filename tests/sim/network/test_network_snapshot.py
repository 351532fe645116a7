"""The engine's snapshot: columns copied on first read during ``decide``, the
link-load average kept only for whoever reads it, frozen usage arrays merged
once."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Decision, Flow, FlowPolicy, Snapshot, create_policy
from laxflow.sim.network import FluidNetwork, Topology


class Keeper(FlowPolicy):
    """Fair sharing that keeps its snapshots (and reads what ``read`` names)."""

    name = "test-keeper"

    def __init__(self, read: tuple[str, ...] = (), reads_load: bool = True) -> None:
        self.read = read
        self.reads_link_load = reads_load  # type: ignore[misc]
        self.snaps: list[Snapshot] = []
        self.values: list[dict] = []

    def decide(self, snap: Snapshot) -> Decision:
        self.snaps.append(snap)
        self.values.append({name: getattr(snap, name).tolist() for name in self.read})
        return self.decision(np.zeros(len(snap.flows), dtype=np.int64))


def two_flows(net: FluidNetwork) -> None:
    net.add_flow(Flow.on_path("a", 4.0, [0]))
    net.add_flow(Flow.on_path("b", 2.0, [0, 1]))
    net.run()


def test_columns_read_during_decide_are_the_engines():
    policy = Keeper(read=("remaining", "size", "arrival", "stage", "bottleneck_rate", "link_load"))
    two_flows(FluidNetwork(Topology.from_links(["x", "y"], [1.0, 2.0]), policy))
    first, later = policy.values[0], policy.values[1]
    assert first["remaining"] == [4.0, 2.0] and first["size"] == [4.0, 2.0]
    assert first["bottleneck_rate"] == [1.0, 1.0] and first["link_load"] == [0.0, 0.0]
    assert later["remaining"] == [2.0] and later["size"] == [4.0]  # b done at t=4 (both at 0.5)
    assert 0.0 < later["link_load"][0] <= 1.0


def test_a_column_first_read_after_decide_is_an_error():
    policy = Keeper()
    two_flows(FluidNetwork(Topology.from_links(["x", "y"], [1.0, 2.0]), policy))
    with pytest.raises(RuntimeError, match="during decide"):
        policy.snaps[0].remaining


def test_link_load_is_kept_only_for_whoever_reads_it():
    topo = Topology.from_links(["x", "y"], [1.0, 2.0])
    fs = FluidNetwork(topo, create_policy("fs"))
    two_flows(fs)
    with pytest.raises(RuntimeError, match="not kept"):
        fs.link_load
    tracked = FluidNetwork(topo, create_policy("fs"), track_link_load=True)
    two_flows(tracked)
    assert tracked.link_load[0] > 0
    liar = Keeper(read=("link_load",), reads_load=False)  # says it does not read it, then does
    with pytest.raises(RuntimeError, match="not kept"):
        two_flows(FluidNetwork(topo, liar))


def test_frozen_usage_arrays_are_merged_once_and_give_the_same_rates():
    topo = Topology.from_links(["x", "y", "z"], [1.0, 2.0, 3.0])
    links, weights = np.array([0, 2, 0]), np.array([1.0, 2.0, 0.5])  # a repeated link: merged to weight 1.5
    frozen_links, frozen_weights = links.copy(), weights.copy()
    frozen_links.flags.writeable = False
    frozen_weights.flags.writeable = False

    def finishes(lk, wt) -> list[float]:
        net = FluidNetwork(topo, create_policy("fs"))
        flows = [Flow(f"f{i}", 1.0 + i, lk, wt) for i in range(3)]
        for f in flows:
            net.add_flow(f)
        net.run()
        return [f.finish for f in flows]

    net = FluidNetwork(topo, create_policy("fs"))
    net.add_flow(Flow("a", 1.0, frozen_links, frozen_weights))
    net.add_flow(Flow("b", 1.0, frozen_links, frozen_weights))
    assert len(net._usage_cache) == 1
    assert finishes(frozen_links, frozen_weights) == finishes(links, weights)
