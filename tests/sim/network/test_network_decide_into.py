"""A policy that decides on the engine's incremental snapshot
(``FlowPolicy.keeps_tags``: read-only views of the engine's columns,
``kept``, ``progressed``, the tags it returned; mfs in its C core) runs the
engine exactly as the same policy on its reference, and as either on plain
snapshots: every finish time, every flow's level, queue and DSCP after
every recompute, its RMLQ notes, the infeasible set, the bytes per stage
and the link-load average, bit for bit; and the engine stores each
decision's tags and hands them back with the flows."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Decision, Flow, FlowPolicy, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine
from laxflow.sim.network.engine import _ffi
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator

native_only = pytest.mark.skipif(not NATIVE, reason="laxflow.policy.mfs._core is not built")
STAGES = list(Stage)


class Recording(MfsPolicy):
    """mfs, counting how it was asked: on the engine's incremental snapshot in
    its C core ("tagged") or on its reference ("reference"), or on a plain
    snapshot ("snapshot": ``keeps_tags`` off); the engine's view of every
    flow is read after each recompute."""

    def __init__(self, native: bool, tags: bool = True, **options) -> None:
        super().__init__(native=native, **options)
        self.keeps_tags = tags
        self.asked = {"tagged": 0, "reference": 0, "snapshot": 0}

    def decide(self, snap):
        route = "snapshot" if snap.tag is None else "tagged" if self.native else "reference"
        self.asked[route] += 1
        out = super().decide(snap)
        assert (out.tag is None) == (snap.tag is None)
        return out


def fluid_run(native: bool, named: bool = False, flow_fields: bool = True, tags: bool = True) -> tuple:
    """Flows of every stage with deadlines, layers and progress on a small fabric
    (``named``: the owner names the flows whose progress it changed;
    ``flow_fields``: the engine's, so the policy's notes too; ``tags``: the
    policy's ``keeps_tags``)."""
    rng = np.random.default_rng(5)
    topo = leaf_spine(32, 4, 1e9, oversubscription=2.0)
    policy = Recording(native, tags, period=2e-5, load_window=1e-4)
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
    net.run()
    s = policy.state
    state = (s.live_batches(), sorted(s.gone_batches()), sorted(s.pruned_names()), s.owners(flows))
    return ([f.finish.hex() for f in flows], [dict(f.state) for f in flows], seen, sorted(policy.infeasible),
            dict(net.bytes_delivered_by_stage), net.link_load.tolist(), net.events, repr(state), policy.asked)


@native_only
def test_incremental_decisions_equal_the_reference_and_decisions_on_snapshots():
    native, reference, plain = fluid_run(True), fluid_run(False), fluid_run(True, tags=False)
    asked_native, asked_reference, asked_plain = native[-1], reference[-1], plain[-1]
    assert asked_native["tagged"] > 500 and asked_native["reference"] == asked_native["snapshot"] == 0
    assert asked_reference == {"tagged": 0, "reference": asked_native["tagged"], "snapshot": 0}
    assert asked_plain == {"tagged": 0, "reference": 0, "snapshot": asked_native["tagged"]}
    assert native[:-1] == reference[:-1] == plain[:-1]
    assert native[3], "the run must see infeasible explicit flows"
    assert any(s.get("rmlq_level", 7) < 3 for s in native[1]), "and promotions"


@native_only
def test_progress_of_the_flows_the_owner_names_is_progress_of_all():
    """``reschedule(flows)``: the C core reads the progress of those flows only
    (some not arrived yet, some finished), and decides as the reference,
    which reads every flow's."""
    named, snapshots = fluid_run(True, named=True), fluid_run(False, named=True)
    assert named[-1]["tagged"] > 500
    assert named[:-1] == snapshots[:-1] == fluid_run(False)[:-1]


def test_the_engine_hands_on_whose_progress_changed():
    topo = leaf_spine(8, 2, 1e9)
    seen = []

    class Watching(MfsPolicy):
        def decide(self, snap):
            progressed = snap.progressed
            seen.append(progressed if isinstance(progressed, bool) else [f.id for f in progressed])
            return super().decide(snap)

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


def test_the_engine_hands_views_of_its_columns_and_keeps_the_tags():
    """The incremental snapshot's ``remaining``, ``tag`` and ``link_load_in_use``
    are read-only views of the engine's columns (at their addresses, which
    move when the flow table grows), ``kept`` counts the flows that had the
    last decision, and each kept flow's tag is the one the last decision gave
    it (the engine stored ``Decision.tag`` and kept it with the flow through
    completions); a new flow's is -1."""
    topo = leaf_spine(8, 2, 1e9)
    seen, last = [], {}

    def address(cdata) -> int:
        return int(_ffi.cast("uintptr_t", cdata))

    class Watching(MfsPolicy):
        def decide(self, snap):
            table = net._table  # the engine's columns as they are now
            at = (snap.remaining.ctypes.data, snap.tag.ctypes.data, snap.link_load_in_use.ctypes.data)
            assert at == (address(table.remaining), address(table.tag), address(table.load))
            assert not (snap.remaining.flags.writeable or snap.tag.flags.writeable
                        or snap.link_load_in_use.flags.writeable)
            assert len(snap.remaining) == len(snap.tag) == len(snap.flows)
            kept = snap.kept
            assert snap.tag[:kept].tolist() == [last[f.id] for f in snap.flows[:kept]]
            assert set(snap.tag[kept:].tolist()) <= {-1}
            assert all(f.id not in last for f in snap.flows[kept:])
            decision = super().decide(snap)
            last.update(zip((f.id for f in snap.flows), decision.tag.tolist()))
            seen.append((at, kept, len(snap.flows)))
            return decision

    net = FluidNetwork(topo, Watching())
    # 20 flows at once, then arrivals ahead of completions: the table's columns grow.
    for i in range(200):
        net.queue.push(max(i - 20, 0) * 1e-6, Priority.ARRIVAL, net.add_flow,
                       Flow.on_path(f"f{i}", 1e6, topo.path(i % 8, (i + 1) % 8), stage=Stage.REUSE, layer=2))
    net.run()
    assert len(seen) > 200
    assert len({at[:2] for at, _, _ in seen}) > 1, "the columns must have moved"
    assert any(0 < kept < n for _, kept, n in seen) and any(kept == n for _, kept, n in seen)


def test_a_decision_with_bad_tags_is_an_error_naming_the_policy():
    topo = leaf_spine(8, 2, 1e9)

    class BadTags(FlowPolicy):
        name = "bad-tags"
        keeps_tags = True

        def decide(self, snap):
            n = len(snap.flows)
            return Decision(level=np.zeros(n, np.int64), queue=np.zeros(n, np.int64),
                            dscp=np.zeros(n, np.uint8), tag=np.zeros(n + 1, np.int64))

    net = FluidNetwork(topo, BadTags())
    net.add_flow(Flow.on_path("f", 1e6, topo.path(0, 1)))
    with pytest.raises(ValueError, match="BadTags: decision.tag must be 1 int64"):
        net.run()


def test_a_policy_without_tags_gets_a_plain_snapshot():
    topo = leaf_spine(8, 2, 1e9)
    seen = []

    class Plain(FlowPolicy):
        name = "plain"

        def decide(self, snap):
            seen.append((snap.kept, snap.progressed, snap.tag, snap.link_load_in_use))
            return self.decision(np.zeros(len(snap.flows), np.int64))

    net = FluidNetwork(topo, Plain())
    net.add_flow(Flow.on_path("f", 1e6, topo.path(0, 1)))
    net.run()
    assert seen and all(s == (0, True, None, None) for s in seen)


@pytest.mark.parametrize("native", [pytest.param(True, marks=native_only), False])
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


@native_only
def test_the_reference_on_plain_snapshots_is_the_core_on_incremental_ones():
    """The route is fixed at construction: each over the same run, the
    reference deciding on plain snapshots (every column copied, no tags) runs
    it as the C core on the engine's incremental ones."""
    core, plain = fluid_run(True), fluid_run(False, tags=False)
    assert plain[-1] == {"tagged": 0, "reference": 0, "snapshot": core[-1]["tagged"]}
    assert core[:-1] == plain[:-1]


@native_only
def test_a_serving_run_is_the_same_on_either_path():
    mix = ("mixtral-8x22b", "qwen-conv")
    results = []
    for native in (True, False):
        cfg = ServingConfig(model=mix[0], cluster=ClusterConfig(servers=16), warmup=20)
        reqs = build_workload(RunSpec(cfg, mix[1], 0.7 * CAPACITY[mix], "mfs", 60, seed=1))
        sim = ServingSimulator(cfg, reqs, MfsPolicy(native=native))
        assert sim.network.policy.native is native
        res = sim.run()
        results.append(([(s.ttft.hex(), s.batch) for s in res.measured], res.network_events))
    assert results[0] == results[1]


@native_only
def test_a_slot_out_of_range_is_an_error_not_a_write_out_of_bounds():
    """The C core checks the indices it is handed (here a corrupted tag) before it writes anything."""
    topo = leaf_spine(8, 2, 1e9)
    policy = MfsPolicy(native=True)
    net = FluidNetwork(topo, policy)
    flows = [Flow.on_path(f"f{i}", 1e6, topo.path(i, (i + 1) % 8), stage=Stage.REUSE, layer=2, current_layer=0)
             for i in range(3)]
    for f in flows:
        net.add_flow(f)
    net.queue.run(until=0.0)  # the first decision: slots in the tag column
    net._table.tag[1] = 10**9
    net.add_flow(Flow.on_path("late", 1e6, topo.path(4, 5), stage=Stage.REUSE))
    with pytest.raises(RuntimeError, match="is no live RMLQ slot of this policy"):
        net.queue.run(until=0.0)
