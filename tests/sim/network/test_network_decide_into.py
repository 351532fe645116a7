"""A policy that writes its decisions into the engine's C buffers
(``FlowPolicy.decide_into``: mfs on its C path) runs the engine exactly as
the same policy deciding on snapshots: every finish time, every flow's
level, queue and DSCP after every recompute, its RMLQ notes, the infeasible
set, the bytes per stage and the link-load average, bit for bit; and a
policy that declines (NotImplemented) is asked through ``decide``."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.core import NATIVE, _ffi
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator

pytestmark = pytest.mark.skipif(not NATIVE, reason="laxflow.policy.mfs._core is not built")
STAGES = list(Stage)


class Recording(MfsPolicy):
    """mfs, counting how it was asked; the engine's view of every flow is read after each recompute."""

    def __init__(self, native: bool, **options) -> None:
        super().__init__(**options)
        self.native = native
        self.asked = {"decide": 0, "decide_into": 0}

    def decide(self, snap):
        self.asked["decide"] += 1
        return super().decide(snap)

    def decide_into(self, *args):
        out = super().decide_into(*args)
        if out is not NotImplemented:
            self.asked["decide_into"] += 1
        return out


def fluid_run(native: bool, toggle: bool = False, named: bool = False, flow_fields: bool = True) -> tuple:
    """Flows of every stage with deadlines, layers and progress on a small fabric
    (``toggle``: the policy switches between its C and Python paths now and then;
    ``named``: the owner names the flows whose progress it changed;
    ``flow_fields``: the engine's, so the policy's notes too)."""
    rng = np.random.default_rng(5)
    topo = leaf_spine(32, 4, 1e9, oversubscription=2.0)
    policy = Recording(native, period=2e-5, load_window=1e-4)
    net = FluidNetwork(topo, policy, load_window=1e-4, flow_fields=flow_fields)
    flows, seen = [], []
    t = 0.0
    for i in range(500):
        t += float(rng.exponential(2e-6))
        src = int(rng.integers(0, 32))
        stage = STAGES[i % 3]
        flow = Flow.on_path(
            f"f{i}", float(rng.exponential(3e4) + 100), topo.path(src, (src + int(rng.integers(1, 32))) % 32),
            arrival=t, stage=stage, request=f"r{i // 4}", batch=f"b{i // 12}",
            deadline=None if i % 7 == 0 else t + float(rng.uniform(2e-5, 4e-4)),
            downstream=float(rng.uniform(0, 2e-5)), layer=int(rng.integers(0, 6)), current_layer=int(rng.integers(0, 3)),
        )  # fmt: skip
        flows.append(flow)
        net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
    for k in range(60):  # requests cross layers and end their compute while their flows are live
        def progress(k=k):
            for f in flows[k * 8: k * 8 + 8]:
                f.current_layer = (f.current_layer or 0) + 1
                f.compute_done = k % 3 == 0
            net.reschedule(flows[k * 8: k * 8 + 8] if named else None)
            seen.append([(f.level, f.queue, f.dscp) for f in net.live])
        net.queue.push(float(k) * 2e-5, Priority.ARRIVAL, progress)
        if toggle:  # between progress events: the next decisions see no reschedule
            net.queue.push(float(k) * 2e-5 + 7e-6, Priority.ARRIVAL, lambda: setattr(policy, "native", not policy.native))
    net.run()
    state = [getattr(policy, a).tolist() for a in ("_explicit_load", "_finished_bytes", "_rank", "_pruned")]
    state += [getattr(policy.rmlq, a).tolist() for a in policy.rmlq._ARRAYS]
    return ([f.finish.hex() for f in flows], [dict(f.state) for f in flows], seen, sorted(policy.infeasible),
            dict(net.bytes_delivered_by_stage), net.link_load.tolist(), net.events, repr(state), policy.asked)


def test_decisions_into_the_table_equal_decisions_on_snapshots():
    native, snapshots = fluid_run(True), fluid_run(False)
    asked_native, asked_snapshots = native[-1], snapshots[-1]
    assert asked_native["decide"] == 0 and asked_native["decide_into"] > 500
    assert asked_snapshots["decide_into"] == 0 and asked_snapshots["decide"] == asked_native["decide_into"]
    assert native[:-1] == snapshots[:-1]
    assert native[3], "the run must see infeasible explicit flows"
    assert any(s.get("rmlq_level", 7) < 3 for s in native[1]), "and promotions"


def test_progress_of_the_flows_the_owner_names_is_progress_of_all():
    """``reschedule(flows)``: the C path reads the progress of those flows only
    (some not arrived yet, some finished), and decides as the snapshot path,
    which reads every flow's."""
    named, snapshots = fluid_run(True, named=True), fluid_run(False, named=True)
    assert named[-1]["decide_into"] > 500
    assert named[:-1] == snapshots[:-1] == fluid_run(False)[:-1]


def test_the_engine_hands_on_whose_progress_changed():
    topo = leaf_spine(8, 2, 1e9)
    seen = []

    class Watching(MfsPolicy):
        def decide_into(self, flows, now, kept, progressed, *args):
            seen.append(progressed if isinstance(progressed, bool) else [f.id for f in progressed])
            return super().decide_into(flows, now, kept, progressed, *args)

    net = FluidNetwork(topo, Watching())
    flows = [Flow.on_path(f"f{i}", 1e6, topo.path(i, (i + 1) % 8), stage=Stage.REUSE, layer=2, current_layer=0)
             for i in range(3)]

    def step(at, action):
        net.queue.push(at, Priority.ARRIVAL, action)

    step(0.0, lambda: [net.add_flow(f) for f in flows])
    step(1e-4, lambda: None)  # (no event of its own: only the completions' recomputes)
    step(2e-4, lambda: (net.reschedule(flows[:1]), net.reschedule(flows[2:])))
    step(3e-4, lambda: (net.reschedule(flows[:1]), net.reschedule()))
    net.run()
    assert seen[0] is True  # the first decision reads every flow's
    assert ["f0", "f2"] in seen and seen.count(True) == 2
    assert all(s is False for s in seen[1:] if s not in (True, ["f0", "f2"]))


def test_the_engine_hands_the_same_buffers_until_they_move():
    """``decide_into``'s buffers are one tuple from call to call while none of
    its pointers changed (the policy binds them once per tuple), and a new
    tuple, holding the new pointers, once the flow table's columns or the
    decision buffers grew."""
    topo = leaf_spine(8, 2, 1e9)
    seen = []

    class Watching(MfsPolicy):
        def decide_into(self, flows, now, kept, progressed, capacity, load_window, buffers, snapshot):
            at = tuple(int(_ffi.cast("uintptr_t", b)) for b in buffers)
            table = net._table  # the engine's columns as they are now
            assert (at[0], at[5]) == (int(_ffi.cast("uintptr_t", table.remaining)), int(_ffi.cast("uintptr_t", table.tag)))
            seen.append((buffers, at + (table.room,)))  # (columns may grow in place: the room says they grew)
            return super().decide_into(flows, now, kept, progressed, capacity, load_window, buffers, snapshot)

    net = FluidNetwork(topo, Watching())
    # 20 flows at once, then arrivals ahead of completions: the table's columns
    # grow at other decisions than the decision buffers (sized by the first).
    for i in range(200):
        net.queue.push(max(i - 20, 0) * 1e-6, Priority.ARRIVAL, net.add_flow,
                       Flow.on_path(f"f{i}", 1e6, topo.path(i % 8, (i + 1) % 8), stage=Stage.REUSE, layer=2))
    net.run()
    assert len(seen) > 200
    pairs = list(zip(seen, seen[1:]))
    assert all(at_before == at_after for (before, at_before), (after, at_after) in pairs if before is after)
    assert any(at_before != at_after for (_, at_before), (_, at_after) in pairs), "the buffers must have moved"
    assert len({id(b) for b, _ in seen}) < 20, "a new tuple only when something moved"


@pytest.mark.parametrize("native", [True, False])
def test_an_owner_that_reads_no_flow_fields_gets_no_notes_and_the_same_run(native):
    """With ``flow_fields=False`` the engine tells the policy nobody reads
    ``Flow.state`` (``FlowPolicy.flow_notes``): MFS writes no ``rmlq_level``
    on either path, and everything else about the run is the same."""
    quiet, noted = fluid_run(native, flow_fields=False), fluid_run(native)
    assert not any("rmlq_level" in state for state in quiet[1])
    assert sum("rmlq_level" in state for state in noted[1]) > 400
    keep = [0, 3, 4, 5, 6, 7]  # finishes, infeasible, bytes per stage, link load, events, policy state
    assert [quiet[i] for i in keep] == [noted[i] for i in keep]
    assert [{k: v for k, v in st.items() if k != "rmlq_level"} for st in noted[1]] == quiet[1]


def test_switching_paths_mid_run_changes_nothing():
    """The C path's kept state (slots in the engine's tags, progress per slot,
    its list of non-zero explicit-load links) is rebuilt after decisions on
    the Python paths, which change the arrays under it."""
    switching, snapshots = fluid_run(True, toggle=True), fluid_run(False)
    assert switching[-1]["decide"] > 100 and switching[-1]["decide_into"] > 100
    assert switching[:-1] == snapshots[:-1]


def test_a_serving_run_is_the_same_on_either_path():
    mix = ("mixtral-8x22b", "qwen-conv")
    results = []
    for native in (True, False):
        cfg = ServingConfig(model=mix[0], cluster=ClusterConfig(servers=16), warmup=20)
        reqs = build_workload(RunSpec(cfg, mix[1], 0.7 * CAPACITY[mix], "mfs", 60, seed=1))
        sim = ServingSimulator(cfg, reqs, "mfs")
        sim.network.policy.native = native
        res = sim.run()
        results.append(([(s.ttft.hex(), s.batch) for s in res.measured], res.network_events))
    assert results[0] == results[1]


def test_a_slot_out_of_range_is_an_error_not_a_write_out_of_bounds():
    """The C step checks the indices it is handed (here a corrupted tag) before it writes anything."""
    topo = leaf_spine(8, 2, 1e9)
    policy = MfsPolicy()
    net = FluidNetwork(topo, policy)
    flows = [Flow.on_path(f"f{i}", 1e6, topo.path(i, (i + 1) % 8), stage=Stage.REUSE, layer=2, current_layer=0)
             for i in range(3)]
    for f in flows:
        net.add_flow(f)
    net.queue.run(until=0.0)  # the first decision: slots in the tag column
    net._table.tag[1] = 10**9
    net.add_flow(Flow.on_path("late", 1e6, topo.path(4, 5), stage=Stage.REUSE))
    with pytest.raises(RuntimeError, match="out of range"):
        net.queue.run(until=0.0)
