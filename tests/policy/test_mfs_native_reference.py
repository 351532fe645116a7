"""The MFS C core (``MfsPolicy(native=True)``, ``laxflow.policy.mfs._core.Core``)
decides exactly as the reference (``native=False``,
:class:`~laxflow.policy.mfs.reference.Reference`).

A long random run (flows arriving and finishing, requests crossing layers
and ending compute, time crossing period ticks or standing still, pruning
standalone or by a coordinator, now and then a snapshot in another order)
drives two policies with the same calls: one in C, one on the reference.
Every decision and the final policy state must be identical; and so must
fluid runs in the network engine (its incremental snapshots) that take
every way through admission and completion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE
from laxflow.policy.red import robust_effective_deadline
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine
from laxflow.sim.network.trace import decision_row
from test_mfs_regression import assert_same_state

LINKS = 24
pytestmark = pytest.mark.skipif(not NATIVE, reason="laxflow.policy.mfs._core is not built: nothing to compare")


def _native(**options):
    p = MfsPolicy(**options, native=True)
    assert p.native
    return p


def _reference(**options):
    return MfsPolicy(**options, native=False)


class _Run:
    """Random serving-like traffic on a small network, one snapshot per step."""

    def __init__(self, seed: int, shuffle: float, done: float = 0.04):
        self.rng = np.random.default_rng(seed)
        self.done = done  # chance that a live flow finishes at a step
        self.capacity = self.rng.uniform(5e9, 25e9, LINKS)
        self.shuffle = shuffle
        self.now = 0.0
        self.live: list[Flow] = []
        self.remaining: dict[int, float] = {}
        self.requests: list[list[Flow]] = []  # flows issued per request
        self.serial = 0

    def arrive(self) -> None:
        rng = self.rng
        r = len(self.requests)
        batch = f"b{r // int(rng.integers(1, 4))}"
        deadline = None if rng.random() < 0.15 else self.now + float(rng.uniform(0.002, 0.05))
        layer0 = int(rng.integers(0, 3))
        flows = []
        for _ in range(int(rng.integers(1, 6))):
            stage = (Stage.REUSE, Stage.COLLECTIVE, Stage.P2D)[int(rng.integers(0, 3))]
            path = rng.choice(LINKS, size=int(rng.integers(1, 4)), replace=False)
            f = Flow(
                id=f"f{self.serial}", size=float(rng.uniform(1e5, 5e7)), links=path,
                weights=rng.uniform(0.2, 1.0, path.size), arrival=self.now, stage=stage, request=f"r{r}",
                batch=batch, deadline=deadline, downstream=float(rng.uniform(0, 0.004)),
                layer=int(rng.integers(0, 12)) if rng.random() < 0.9 else None,
                current_layer=layer0 if rng.random() < 0.9 else None,
            )  # fmt: skip
            self.serial += 1
            flows.append(f)
            self.live.append(f)
            self.remaining[id(f)] = f.size
        self.requests.append(flows)

    def step(self, policies) -> None:
        rng = self.rng
        # Time: mostly forward (some across several 1 ms ticks), sometimes not at all.
        if rng.random() < 0.8:
            self.now += float(rng.choice([rng.uniform(0, 2e-4), rng.uniform(5e-4, 3e-3)]))
        for _ in range(int(rng.poisson(0.6))):
            self.arrive()
        for flows in self.requests[-12:]:
            if rng.random() < 0.08:  # a layer boundary: every flow of the request sees it
                for f in flows:
                    f.current_layer = (f.current_layer or 0) + int(rng.integers(1, 3))
            if rng.random() < 0.02:
                for f in flows:
                    f.compute_done = True
        for f in self.live:
            self.remaining[id(f)] *= float(rng.uniform(0.7, 1.0))
        # Completions (each policy hears of each one), then the snapshot.
        done = [f for f in self.live if rng.random() < self.done]
        for f in done:
            self.live.remove(f)
            for p in policies:
                p.on_complete(f, self.now)
        if not self.live:
            return None
        order = list(self.live)
        if rng.random() < self.shuffle:  # an owner that lists its flows in another order
            rng.shuffle(order)
        return Snapshot(
            now=self.now, flows=order, remaining=np.array([self.remaining[id(f)] for f in order]),
            capacity=self.capacity, link_load=rng.uniform(0, 1.0, LINKS), load_window=0.01,
        )  # fmt: skip


@pytest.mark.parametrize(
    "seed, options, coordinator",
    [
        (1, {}, False),
        (2, {}, False),
        (3, {"drop_budget": 3}, False),
        (4, {"drop_budget": 1, "period": 5e-4}, False),
        (5, {}, True),
    ],
)
def test_native_equals_the_reference_over_a_long_run(seed, options, coordinator):
    run = _Run(seed, shuffle=0.01)
    core, ref = _native(**options), _reference(**options)
    decisions = big = 0
    for step in range(2500):
        snap = run.step((core, ref))
        if snap is None:
            run.arrive()
            continue
        if coordinator and step % 97 == 0:
            batches = sorted({f.batch for f in snap.flows})
            order = {b: int(run.rng.integers(0, 5)) for b in batches}  # ties included
            pruned = [f.request for f in snap.flows if run.rng.random() < 0.05]
            for p in (core, ref):
                p.set_order(order, pruned)
        got, want = decision_row(core.decide(snap)), decision_row(ref.decide(snap))
        assert got == want, f"step {step}: {len(snap.flows)} flows"
        _assert_red_memo(core)
        decisions += 1
        big += len(snap.flows) > 48
    assert decisions > 2000 and big > 200  # long, and many decisions over many flows
    if options.get("drop_budget"):
        assert core.pruned_requests == ref.pruned_requests and ref.pruned_requests
    assert_same_state(ref, core, run.live)
    assert core.infeasible == ref.infeasible


def _assert_red_memo(p: MfsPolicy) -> None:
    """Every live batch's RED is that of its live deadlines now."""
    for red, name, b in p.state.live_batches():
        deadlines = p.state.deadlines(b)
        want = robust_effective_deadline(deadlines).red if deadlines else math.inf
        assert red == want or (red != red and want != want), name


@pytest.mark.parametrize("seed, options", [(9, {}), (10, {"drop_budget": 2}), (11, {"coordinator": True})])
def test_few_flow_decisions_equal_the_reference(seed, options):
    """A few live flows from several batches (the serving median), RED ranks
    and pruning changing under them: the native path and the reference agree."""
    options = dict(options)
    coordinator = options.pop("coordinator", False)
    run = _Run(seed, shuffle=0.0, done=0.3)
    vector, native = _reference(**options), _native(**options)
    small = 0
    for step in range(3000):
        snap = run.step((vector, native))
        if snap is None:
            run.arrive()
            continue
        if coordinator and step % 7 == 0:
            order = {b: int(run.rng.integers(0, 4)) for b in {f.batch for f in snap.flows}}
            pruned = [f.request for f in snap.flows if run.rng.random() < 0.05]
            for p in (vector, native):
                p.set_order(order, pruned)
        want = decision_row(vector.decide(snap))
        assert decision_row(native.decide(snap)) == want, f"step {step}"
        for p in (vector, native):
            _assert_red_memo(p)
        small += 2 <= len(snap.flows) <= 10 and len({f.batch for f in snap.flows}) > 1
    assert small > 1000


def test_native_reads_a_snapshot_link_load_as_it_is():
    """A snapshot's link_load outside [0, 1] (a daemon's meter on a bursty port)
    is read as given on every path: the C step clips only the engine's own array."""
    run = _Run(12, shuffle=0.0)
    native, scalar = _native(), _reference()
    steps = 0
    for _ in range(1500):
        snap = run.step((native, scalar))
        if snap is None:
            run.arrive()
            continue
        snap = Snapshot(now=snap.now, flows=snap.flows, remaining=snap.remaining, capacity=snap.capacity,
                        link_load=snap.link_load * 1.6 - 0.3, load_window=snap.load_window)
        assert decision_row(native.decide(snap)) == decision_row(scalar.decide(snap))
        steps += 1
    assert steps > 1000
    assert_same_state(scalar, native, run.live)
    assert native.infeasible == scalar.infeasible


class LateFlow(Flow):
    """A Flow subclass with its own due time (admission must ask the subclass)."""

    @property
    def due(self) -> float | None:
        return None if self.deadline is None else self.deadline - 2 * self.downstream


def _shapes(topo, count: int, frozen: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for i in range(count):
        links = np.asarray(topo.path(i % 32, (i * 7 + 3) % 32), np.int64)
        weights = np.full(len(links), 1.0 + (i % 3) * 0.5)
        links.flags.writeable = weights.flags.writeable = not frozen
        out.append((links, weights))
    return out


def _fluid_run(native: bool, external: bool = False, drop_budget: int = 0) -> tuple:
    """A fluid run of 600 flows (shapes shared and read-only or not, a Flow
    subclass, bursts that outgrow the free slots, batches leaving and coming
    back, progress named or not; ``external``: a coordinator's order arrives
    mid-run): finish times, notes, the policy's state mid-run and at the end."""
    rng = np.random.default_rng(11)
    topo = leaf_spine(32, 4, 1e9, oversubscription=2.0)
    policy = MfsPolicy(period=2e-5, load_window=1e-4, drop_budget=drop_budget, native=native)
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
            f"f{i}", float(rng.exponential(3e4) + 100), links, weights, arrival=t, stage=list(Stage)[i % 3],
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
    if external:
        net.queue.push(4e-4, Priority.ARRIVAL, policy.set_order, {f"b{j}": 50 - j for j in range(0, 50, 2)},
                       [f"r{j}" for j in range(0, 150, 9)])
    states = []  # the policy's state mid-run too

    def state():
        live = list(net.live)
        s = policy.state
        states.append(repr((s.live_batches(), sorted(s.gone_batches()), sorted(s.pruned_names()), s.owners(live),
                            [(s.level(f, True), s.level(f, False)) for f in live], sorted(policy.infeasible))))

    for k in range(60):
        net.queue.push(k * 2.3e-5, Priority.TIMER, state)
    net.run()
    state()
    return [f.finish.hex() for f in flows], [dict(f.state) for f in flows], states, net.events


@pytest.mark.parametrize("options", [{}, {"external": True}, {"drop_budget": 2}], ids=["plain", "external", "pruning"])
def test_a_fluid_run_is_the_same_on_either_state(options):
    core, ref = _fluid_run(True, **options), _fluid_run(False, **options)
    assert core == ref
    assert any("infeasible" in s for s in ref[1]) and sum("rmlq_level" in s for s in ref[1]) > 500
