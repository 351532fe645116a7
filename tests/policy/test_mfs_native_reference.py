"""The MFS C core (``laxflow.policy.mfs.core``) decides exactly as the reference (the
vectorized ``MfsPolicy.decide``, run with ``native`` False).

A long random run (flows arriving and finishing, requests crossing layers
and ending compute, time crossing period ticks or standing still, pruning
standalone or by a coordinator, now and then a snapshot in another order)
drives two policies with the same calls: one in C, one on the reference.
Every decision and the final policy state must be identical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.core import NATIVE
from laxflow.policy.red import robust_effective_deadline
from laxflow.sim.network.trace import decision_row

LINKS = 24


def _native(**options):
    if not NATIVE:
        pytest.skip("laxflow.policy.mfs._core is not built")
    p = MfsPolicy(**options)
    p.native = True
    return p


def _reference(**options):
    p = MfsPolicy(**options)
    p.native = False
    return p


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
        if step % 250 == 0:
            _assert_facts(core)
            _assert_facts(ref)
        decisions += 1
        big += len(snap.flows) > 48
    assert decisions > 2000 and big > 200  # long, and many decisions over many flows
    if options.get("drop_budget"):
        assert core.pruned_requests == ref.pruned_requests and ref.pruned_requests
    for attr in ("_explicit_load", "_finished_bytes", "_rank", "_pruned", "_last_t"):
        assert np.array_equal(getattr(core, attr), getattr(ref, attr)), attr
    for attr in core.rmlq._ARRAYS:
        assert np.array_equal(getattr(core.rmlq, attr), getattr(ref.rmlq, attr), equal_nan=True), attr
    assert core.infeasible == ref.infeasible


def _assert_facts(p: MfsPolicy) -> None:
    """Every live slot's ``Rmlq.facts`` tuple holds exactly its arrays' values."""
    t = p.rmlq
    names = ("explicit", "stage", "bneck_link", "bneck_rate", "bneck_weight", "batch", "request", "target", "due")
    assert t.slot
    for s in t.slot.values():
        want = tuple(getattr(t, name)[s].item() for name in names)
        got = t.facts[s]
        assert all(type(a) is type(b) for a, b in zip(got, want)), (got, want)
        assert np.array_equal(np.array(got, float), np.array(want, float), equal_nan=True), (got, want)


def _assert_red_memo(p: MfsPolicy) -> None:
    """Every RED the policy kept for a batch is that of the batch's live deadlines now."""
    for b, red in p._batch_red.items():
        deadlines = p._deadlines(b)  # (a KeyError: a memo for a batch that is not live)
        assert red == (robust_effective_deadline(deadlines).red if deadlines else math.inf), b


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
    assert np.array_equal(native.rmlq.urgency, scalar.rmlq.urgency) and native.infeasible == scalar.infeasible
