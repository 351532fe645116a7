"""The daemon-facing policy interface: queues and DSCP in every decision, one
stage encoding with the shim, and the link-load window contract."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage, available_policies, create_policy
from laxflow.policy.base import BASELINE_DSCP_MAP
from laxflow.policy.dscp import DscpMap, default_dscp_map
from laxflow.policy.flow import STAGE_CODES, STAGE_NONE, STAGE_OF_CODE
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.network import FluidNetwork, Topology


def _flows() -> list[Flow]:
    out = []
    for k in range(12):
        stage = (Stage.REUSE, Stage.COLLECTIVE, Stage.P2D)[k % 3]
        out.append(Flow.on_path(
            f"f{k}", 1.0 + k, [k % 2], stage=stage, request=f"r{k // 3}", batch=f"b{k // 6}",
            deadline=2.0 + 0.1 * k, layer=k % 4, current_layer=0, downstream=0.05,
        ))  # fmt: skip
    return out


def _snapshot(flows: list[Flow], window: float = 0.01) -> Snapshot:
    return Snapshot(
        now=0.0, flows=flows, remaining=np.array([f.size for f in flows]), capacity=np.array([10.0, 20.0]),
        link_load=np.array([0.2, 0.0]), load_window=window,
    )  # fmt: skip


def test_stage_codes_are_the_shims():
    shm = pytest.importorskip("laxflow.protocol.shm", reason="the native shared-memory binding is not built")
    assert STAGE_NONE == shm.Stage.NONE
    for stage, code in STAGE_CODES.items():
        assert code == shm.Stage[stage.name] and stage.code == code and STAGE_OF_CODE[code] is stage
    assert set(STAGE_CODES.values()) | {STAGE_NONE} == {int(s) for s in shm.Stage}


@pytest.mark.parametrize("name", available_policies())
def test_every_policy_tags_each_flow_with_queue_and_dscp(name):
    policy = create_policy(name)
    flows = _flows()
    d = policy.decide(_snapshot(flows))
    n = len(flows)
    assert d.queue.shape == (n,) and d.queue.dtype.kind == "i" and d.dscp.shape == (n,) and d.dscp.dtype == np.uint8
    table = policy.dscp_map
    assert (d.queue >= 0).all() and (d.queue <= table.levels).all()
    assert d.dscp.tolist() == [table.dscp(q) for q in d.queue.tolist()]
    # The switch class never contradicts the host order.
    order = np.argsort(d.level, kind="stable")
    assert (np.diff(d.queue[order]) >= 0).all()


def test_baselines_fold_levels_onto_their_map():
    flows = [Flow.on_path(f"f{k}", 1.0 + k, [0]) for k in range(10)]
    d = create_policy("sjf").decide(_snapshot(flows))
    assert d.level.tolist() == list(range(10))
    assert d.queue.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7, 7]
    assert d.dscp.tolist() == [39, 38, 37, 36, 35, 34, 33, 32, 32, 32]
    fs = create_policy("fs").decide(_snapshot(flows))
    assert set(fs.queue.tolist()) == {0} and set(fs.dscp.tolist()) == {BASELINE_DSCP_MAP.dscp(0)}
    small = DscpMap(level_dscp=(20, 10), level_tc=(2, 1))
    d2 = create_policy("sjf", dscp=small).decide(_snapshot(flows))
    assert d2.queue.tolist() == [0] + [1] * 9 and d2.dscp.tolist() == [20] + [10] * 9
    with pytest.raises(ValueError, match="dscp must be a DscpMap"):
        create_policy("edf", dscp={"levels": [1]})


def test_mfs_tags_pruned_requests_with_the_scavenger_class():
    policy = MfsPolicy(levels=4)
    flows = _flows()
    policy.set_order({"b0": 0, "b1": 1}, pruned=["r1"])
    d = policy.decide(_snapshot(flows))
    for i, f in enumerate(flows):
        assert d.queue[i] == policy.queue_level(f) and d.dscp[i] == policy.dscp(f)
        if f.request == "r1" and f.stage is not Stage.COLLECTIVE:
            assert d.queue[i] == 4 and d.dscp[i] == default_dscp_map(4).scavenger_dscp


def test_engine_writes_queue_and_dscp_into_flows():
    policy = create_policy("sjf")
    net = FluidNetwork(Topology.from_links(["L"], [1.0]), policy)
    flows = [Flow.on_path(f"f{k}", 1.0 + k, [0]) for k in range(3)]
    for f in flows:
        net.add_flow(f)
    seen = []
    net.queue.push(0.5, 0, lambda: seen.append([(f.queue, f.dscp) for f in flows]))
    net.run()
    assert seen == [[(0, 39), (1, 38), (2, 37)]]


def test_mfs_refuses_a_link_load_of_another_window():
    policy = MfsPolicy()
    with pytest.raises(ValueError, match=r"moving average over 0\.02 s but MfsConfig.load_window is 0\.01 s"):
        policy.decide(_snapshot(_flows(), window=0.02))
    MfsPolicy(load_window=0.02).decide(_snapshot(_flows(), window=0.02))


def test_engine_states_its_window_to_mfs():
    net = FluidNetwork(Topology.from_links(["L"], [1.0]), MfsPolicy(), load_window=0.05)
    net.add_flow(Flow.on_path("a", 1.0, [0], stage=Stage.P2D, deadline=5.0))
    with pytest.raises(ValueError, match="load_window is 0.01 s"):
        net.run()
    ok = FluidNetwork(Topology.from_links(["L"], [1.0]), MfsPolicy(load_window=0.05), load_window=0.05)
    f = Flow.on_path("a", 1.0, [0], stage=Stage.P2D, deadline=5.0)
    ok.add_flow(f)
    ok.run()
    assert f.finish == pytest.approx(1.0)
