"""The mfs policy's admission, completion and incremental-decision glue in C
(``mfs/glue.c``, ``laxflow.policy.mfs._glue``) leaves the policy exactly as
its Python does: the same slots, facts tuples (values and types), batch and
request tables in the same order, flags, explicit-load sums, decisions and
finish times, over runs that take every way through it: shapes shared and
frozen (the bottleneck cache) or not, a Flow subclass, bursts that outgrow
the free slots, batches leaving and coming back, explicit flows finishing
while the C state is unbound (decisions on the Python paths in between),
a coordinator's order, and pruning."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from laxflow.policy import Flow, Stage
from laxflow.policy.mfs import core as mfs_native
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator

pytestmark = pytest.mark.skipif(not mfs_native.NATIVE, reason="laxflow.policy.mfs._core is not built")
STAGES = list(Stage)


class LateFlow(Flow):
    """A Flow subclass with its own due time (admission must ask the subclass)."""

    @property
    def due(self) -> float | None:
        return None if self.deadline is None else self.deadline - 2 * self.downstream


class CountingGlue:
    """The real Glue, counting what the policy hands it."""

    made: list[CountingGlue] = []

    def __init__(self, *args) -> None:
        self.real = REAL_GLUE(*args)
        self.calls: Counter = Counter()
        CountingGlue.made.append(self)

    def __getattr__(self, name):
        method = getattr(self.real, name)

        def counted(*args):
            out = method(*args)
            self.calls[name, out is not False] += 1
            return out

        return counted


REAL_GLUE = mfs_native.Glue


def _shapes(topo, count: int, frozen: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for i in range(count):
        links = np.asarray(topo.path(i % 32, (i * 7 + 3) % 32), np.int64)
        weights = np.full(len(links), 1.0 + (i % 3) * 0.5)
        links.flags.writeable = weights.flags.writeable = not frozen
        out.append((links, weights))
    return out


def _run(glue, toggle: bool = False, external: bool = False, drop_budget: int = 0) -> tuple:
    """A fluid run of 600 flows whose policy has the glue (``glue``: the Glue
    class, None: none); ``toggle``: it switches to its Python paths now and
    then; ``external``: a coordinator's order arrives mid-run."""
    mfs_native.Glue = glue
    try:
        rng = np.random.default_rng(11)
        topo = leaf_spine(32, 4, 1e9, oversubscription=2.0)
        policy = MfsPolicy(period=2e-5, load_window=1e-4, drop_budget=drop_budget)
        net = FluidNetwork(topo, policy, load_window=1e-4)
        frozen, loose = _shapes(topo, 12, True), _shapes(topo, 5, False)
        flows = []
        t = 0.0
        for i in range(600):
            burst = i % 100 < 30  # 30 flows at one instant: more than the free slots
            t += 0.0 if burst and i % 100 else float(rng.exponential(3e-6))
            links, weights = (frozen if i % 5 else loose)[i % (12 if i % 5 else 5)]
            kind = LateFlow if i % 11 == 0 else Flow
            deadline = None if i % 7 == 0 else t + float(rng.uniform(2e-5, 4e-4))
            flow = kind.trusted(
                f"f{i}", float(rng.exponential(3e4) + 100), links, weights, arrival=t, stage=STAGES[i % 3],
                request=f"r{i // 4}", batch=f"b{i // 12}", deadline=deadline, downstream=float(rng.uniform(0, 2e-5)),
                layer=int(rng.integers(0, 6)), current_layer=int(rng.integers(0, 3)) if i % 9 else None,
            )  # fmt: skip
            flows.append(flow)
            net.queue.push(t, Priority.ARRIVAL, net.add_flow, flow)
        for k in range(40):  # requests cross layers and end their compute while their flows are live
            def progress(k=k):
                for f in flows[k * 12 : k * 12 + 12]:
                    f.current_layer = (f.current_layer or 0) + 1
                    f.compute_done = k % 3 == 0
                net.reschedule(flows[k * 12 : k * 12 + 12] if k % 2 else None)
            net.queue.push(k * 3e-5, Priority.ARRIVAL, progress)
            if toggle and not 4 < k < 10:  # the Python paths in even windows, and from 1.3e-4 to 3.1e-4 s
                net.queue.push(k * 3e-5 + 1e-5, Priority.ARRIVAL, setattr, policy, "native", k % 2 == 1)
        if toggle:  # a burst there: the RMLQ grows under the C state (over 1000 flows: the vectorized
            # path, whose view is never active) and explicit flows finish while the C state is stale
            for j in range(1100):
                flow = Flow.trusted(f"g{j}", float(rng.uniform(100, 3000)), *frozen[j % 12], arrival=1.4e-4,
                                    stage=Stage.P2D, request=f"q{j // 6}", batch=f"c{j // 24}", deadline=1e-3,
                                    layer=3, current_layer=1)  # fmt: skip
                flows.append(flow)
                net.queue.push(1.4e-4, Priority.ARRIVAL, net.add_flow, flow)
        if external:
            net.queue.push(4e-4, Priority.ARRIVAL, policy.set_order, {f"b{j}": 50 - j for j in range(0, 50, 2)},
                           [f"r{j}" for j in range(0, 150, 9)])
        states = []  # the policy's state mid-run too (memos and flags that are gone by the end)
        for k in range(60):
            net.queue.push(k * 2.3e-5, Priority.TIMER, lambda: states.append(_state(policy)))
        net.run()
        return [f.finish.hex() for f in flows], [dict(f.state) for f in flows], states, _state(policy), net.events
    finally:
        mfs_native.Glue = REAL_GLUE


def _state(p: MfsPolicy) -> str:
    """Everything the policy keeps, with flows named by id, in its containers' order."""
    t = p.rmlq
    named = {f: f.id for f in t.slot}
    arrays = [getattr(p, a).tolist() for a in ("_explicit_load", "_finished_bytes", "_rank", "_pruned")]
    arrays += [getattr(t, a).tolist() for a in t._ARRAYS]
    tables = [
        [(named.get(f, f.id), s) for f, s in t.slot.items()], t._free, t.facts, p._batch_index, p._request_index,
        p._request_batch, p._request_deadline, {b: [(f.id, r) for f, r in live.items()] for b, live in p._live_flows.items()},
        p._live_requests, sorted(p._touched), p._batch_red, p._ranked_red, sorted(p._finished_links),
        p._order_stale, p._red_moved, p._last_t, sorted(p.infeasible), sorted(p.pruned_requests),
    ]  # fmt: skip
    return repr((arrays, tables))


@pytest.mark.skipif(REAL_GLUE is None, reason="laxflow.policy.mfs._glue is not built")
@pytest.mark.parametrize("options", [{}, {"toggle": True}, {"external": True}, {"drop_budget": 2}],
                         ids=["plain", "toggle", "external", "pruning"])
def test_the_glue_leaves_the_policy_as_its_python_does(options):
    CountingGlue.made.clear()
    with_glue, without = _run(CountingGlue, **options), _run(None, **options)
    assert with_glue == without
    (glue,) = CountingGlue.made
    calls = glue.calls
    # It did the work: decisions, admissions (the first ones through admit),
    # completions, and declined some (unbound, or the view active) only when toggling.
    assert calls["decide", True] > 400 and calls["complete", True] > 400 and calls["admit", True] >= 1
    assert calls["complete", False] > 0 if options.get("toggle") else calls["complete", False] == 0


@pytest.mark.skipif(REAL_GLUE is None, reason="laxflow.policy.mfs._glue is not built")
def test_a_request_back_in_a_live_batch_reorders_at_the_next_departure():
    """Request r3 of batch b1 leaves it and comes back (its next layer) while
    b1 stays live: b1's RED drops below b2's again. Nothing reorders then
    (r3 is known, b1 was live), but the next batch departure (b3, elsewhere)
    does, and b1's transfers go first from there on, with or without the glue."""
    def run(glue):
        mfs_native.Glue = glue
        try:
            topo = leaf_spine(8, 2, 1e9)
            net = FluidNetwork(topo, MfsPolicy())
            shared = topo.path(0, 5)

            def flow(name, request, batch, deadline, size, path=shared, at=0.0):
                f = Flow.on_path(name, size, path, stage=Stage.REUSE, request=request, batch=batch,
                                 deadline=deadline, layer=2, current_layer=0)
                net.queue.push(at, Priority.ARRIVAL, net.add_flow, f)
                return f

            flows = [
                flow("b2.x", "r2", "b2", 5.0, 4e6), flow("b1.x", "r1", "b1", 6.0, 4e6),
                flow("b1.y0", "r3", "b1", 1.0, 1e4, topo.path(1, 6)),  # r3's first layer: gone by 1e-5 s
                flow("b3.x", "r4", "b3", 7.0, 2e5, topo.path(2, 7)),  # departs at ~2e-4 s
                flow("b4.x", "r5", "b4", 8.0, 1e4, topo.path(3, 4), at=5e-5),  # a new batch: a reorder (b1 after b2)
                flow("b1.y", "r3", "b1", 1.0, 4e6, at=1e-4),  # r3 back: b1's RED 3.5 < 5
            ]  # fmt: skip
            net.run()
            return {f.id: f.finish for f in flows}
        finally:
            mfs_native.Glue = REAL_GLUE

    with_glue = run(REAL_GLUE)
    assert with_glue == run(None)
    assert with_glue["b3.x"] < with_glue["b1.x"] < with_glue["b2.x"]
    assert with_glue["b1.y"] < with_glue["b2.x"]


@pytest.mark.skipif(REAL_GLUE is None, reason="laxflow.policy.mfs._glue is not built")
def test_the_bottleneck_cache_is_read_for_this_capacity_only():
    """An entry for a shape kept under another capacity array is not this network's bottleneck."""
    topo = leaf_spine(8, 2, 1e9)
    links = np.asarray(topo.path(0, 5), np.int64)
    weights = np.ones(len(links))
    links.flags.writeable = weights.flags.writeable = False
    facts = []
    for stale in (False, True):
        policy = MfsPolicy()
        net = FluidNetwork(topo, policy)
        if stale:  # what a cache filled under another capacity would hold
            policy._bneck_cache[(id(links), id(weights))] = (links, weights, np.ones(1), (7, 1.0, 1.0))
        flows = [Flow.trusted(f"f{i}", 1e6, links, weights, stage=Stage.REUSE, layer=2, current_layer=0)
                 for i in range(3)]
        for i, f in enumerate(flows):
            net.queue.push(i * 1e-4, Priority.ARRIVAL, net.add_flow, f)
        seen = []
        net.queue.push(2.5e-4, Priority.ARRIVAL, lambda: seen.extend(policy.rmlq.facts[policy.rmlq.slot[f]]
                                                                    for f in flows if f in policy.rmlq.slot))
        net.run()
        assert policy._glue is not None and len(seen) == 3  # (the last two were admitted by the glue)
        facts.append(seen)
    assert facts[0] == facts[1]
    assert all(f[2] != 7 for f in facts[1])


@pytest.mark.skipif(REAL_GLUE is None, reason="laxflow.policy.mfs._glue is not built")
def test_a_serving_run_is_the_same_without_the_glue():
    """The serving simulator's shapes are frozen and shared: the glue's bottleneck cache path."""
    mix = ("mixtral-8x22b", "qwen-conv")
    results = []
    for glue in (CountingGlue, None):
        mfs_native.Glue = glue
        try:
            cfg = ServingConfig(model=mix[0], cluster=ClusterConfig(servers=16), warmup=20)
            reqs = build_workload(RunSpec(cfg, mix[1], 0.7 * CAPACITY[mix], "mfs", 60, seed=2))
            sim = ServingSimulator(cfg, reqs, "mfs")
            net, states = sim.network, []
            decide = net.policy.decide

            def recorded(snap):  # the policy's state every 89th decision too (memos gone by the end)
                assert snap.tag is not None  # (the incremental snapshot: the glue's path)
                out = decide(snap)
                if len(states) < 10_000 and net.events % 89 == 0:
                    states.append(_state(net.policy))
                return out

            net.policy.decide = recorded
            res = sim.run()
            results.append(([(s.ttft.hex(), s.batch) for s in res.measured], res.network_events, states,
                            _state(net.policy)))
        finally:
            mfs_native.Glue = REAL_GLUE
    assert results[0] == results[1]


@pytest.mark.skipif(REAL_GLUE is None, reason="laxflow.policy.mfs._glue is not built")
def test_bad_calls_into_the_glue_are_errors():
    policy = MfsPolicy()
    core = mfs_native.NativeCore(policy)
    glue = core.glue
    with pytest.raises(TypeError, match="7 arguments"):
        glue.decide([], 0.0)
    with pytest.raises(TypeError, match="must be a list"):
        glue.decide((), 0.0, 0, False, None, None, None)
    with pytest.raises(RuntimeError, match="no engine tag column"):  # (never bound to an engine)
        glue.admit([Flow.on_path("f", 1.0, [0])], 0, np.ones(1), False)
    with pytest.raises(TypeError):
        mfs_native.Glue(policy)


@pytest.mark.skipif(REAL_GLUE is None, reason="laxflow.policy.mfs._glue is not built")
def test_a_policy_with_the_glue_is_freed_when_dropped():
    """The policy holds its glue and the glue its policy: the collector must see the cycle."""
    import gc
    import weakref

    topo = leaf_spine(8, 2, 1e9)
    policy = MfsPolicy()
    net = FluidNetwork(topo, policy)
    for i in range(5):
        net.queue.push(i * 1e-5, Priority.ARRIVAL, net.add_flow, Flow.on_path(f"f{i}", 1e5, topo.path(i, 7 - i)))
    net.run()
    assert policy._glue is not None
    gone = weakref.ref(policy)
    del policy, net
    gc.collect()
    assert gone() is None
