"""``MfsPolicy.forget``: a long-running owner (the node daemon) frees departed
batches, and the policy's batch and request tables stay bounded while its
decisions stay exactly those of a policy that never forgets."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Stage
from laxflow.policy.base import FlowPolicy, Snapshot
from laxflow.policy.fair_sharing import FairSharing
from laxflow.policy.mfs import MfsPolicy
from laxflow.policy.mfs.policy import NATIVE

LINKS = 6
CORE = pytest.mark.skipif(not NATIVE, reason="laxflow.policy.mfs._core is not built")
NATIVE_CHOICES = [pytest.param(True, marks=CORE), False]


def _tables(p: MfsPolicy) -> dict[str, int]:
    """Size of every per-batch and per-request table and memo of the policy (its state's ``sizes``)."""
    return {**p.state.sizes(), "gone": len(p.state.gone_batches()), "infeasible": len(p.infeasible),
            "infeasible_of": len(p._infeasible_of)}


def _snapshot(now: float, live: list[Flow], remaining: dict[str, float], capacity: np.ndarray) -> Snapshot:
    return Snapshot(now=now, flows=list(live), remaining=np.array([remaining[f.id] for f in live]),
                    capacity=capacity, link_load=np.zeros(LINKS), load_window=0.01)


def test_the_base_policy_forgets_nothing():
    FairSharing().forget(["b0", "never-seen"])  # the FlowPolicy default: a no-op
    assert FlowPolicy.forget is FairSharing.forget


@pytest.mark.parametrize("native, rounds", [pytest.param(True, 1000, marks=CORE), (False, 200)])
def test_100k_batches_formed_and_forgotten_leave_the_tables_bounded(native, rounds):
    """100,000 batches (one request, two flows each) come, are decided, complete
    and are forgotten, 100 at a time: every table ends as large as 100 batches
    needed, not 100,000 (without forget they grow by one entry per batch).
    Every tenth batch's P2D flow is past its deadline (infeasible: its id is
    kept in ``infeasible`` until its batch is forgotten).
    (20,000 on the reference path, which is slower.)"""
    p = MfsPolicy(native=native)
    capacity = np.full(LINKS, 1e10)
    now, serial, sizes = 0.0, 0, []
    for rnd in range(rounds):
        live, remaining, names = [], {}, []
        for j in range(100):
            b = f"b{serial}"
            serial += 1
            names.append(b)
            for k, stage in enumerate((Stage.REUSE, Stage.P2D)):
                late = j % 10 == 0
                f = Flow.on_path(f"{b}.{k}", 1e6, [j % LINKS], stage=stage, request=f"{b}.r", batch=b,
                                 deadline=now - 1.0 if late else now + 0.01, layer=1)
                live.append(f)
                remaining[f.id] = f.size
        now += 1e-3
        p.decide(_snapshot(now, live, remaining, capacity))
        assert len(p.infeasible) == 10, "every tenth batch's P2D flow is infeasible"
        now += 1e-3
        for f in live:
            p.on_complete(f, now)
        p.forget(names)
        assert all(p.state.batch_index(b) is None for b in names)  # freed, none left pending
        if rnd in (10, rounds - 1):
            sizes.append(_tables(p))
    assert serial == 100 * rounds
    first, last = sizes
    assert last == first, f"the tables grew between round 10 and round {rounds}"
    for name, size in last.items():
        assert size <= 256, f"{name} holds {size} entries after {serial} forgotten batches"
    assert last["live_batches"] == 0 and p.pruned_requests == set()
    assert last["infeasible"] == last["infeasible_of"] == 0


@pytest.mark.parametrize("native", NATIVE_CHOICES)
@pytest.mark.parametrize("drop_budget", [0, 2])
def test_forgetting_changes_no_decision(native, drop_budget):
    """Two policies see the same random traffic; one is told of every batch
    whose flows all completed (and of some still live, freed later), the
    other of none: every decision is the same, and the forgetting one's
    tables stay small while the other's grow."""
    rng = np.random.default_rng(5)
    keep, drop = MfsPolicy(drop_budget=drop_budget, native=native), MfsPolicy(drop_budget=drop_budget, native=native)
    capacity = rng.uniform(5e9, 25e9, LINKS)
    now, serial, batch_no = 0.0, 0, 0
    live: list[Flow] = []
    remaining: dict[str, float] = {}
    of_batch: dict[str, int] = {}
    decisions = 0
    for step in range(1500):
        now += float(rng.uniform(0, 2e-3))
        if rng.random() < 0.5:  # a batch of 1-3 requests arrives
            b = f"b{batch_no}"
            batch_no += 1
            for r in range(int(rng.integers(1, 4))):
                deadline = None if rng.random() < 0.2 else now + float(rng.uniform(0.002, 0.03))
                for _ in range(int(rng.integers(1, 4))):
                    stage = (Stage.REUSE, Stage.COLLECTIVE, Stage.P2D)[int(rng.integers(0, 3))]
                    f = Flow.on_path(f"f{serial}", float(rng.uniform(1e5, 3e7)), [int(rng.integers(0, LINKS))],
                                     stage=stage, request=f"{b}.r{r}", batch=b, deadline=deadline,
                                     layer=int(rng.integers(0, 8)), current_layer=0, downstream=1e-3)
                    serial += 1
                    live.append(f)
                    remaining[f.id] = f.size
                    of_batch[b] = of_batch.get(b, 0) + 1
        for f in live:
            remaining[f.id] *= float(rng.uniform(0.6, 1.0))
        gone = [f for f in live if rng.random() < 0.15]
        departed = []
        for f in gone:
            live.remove(f)
            keep.on_complete(f, now)
            drop.on_complete(f, now)
            of_batch[f.batch] -= 1
            if not of_batch[f.batch]:
                departed.append(f.batch)
        early = [f.batch for f in live if rng.random() < 0.01]  # told early: freed once its flows are done
        drop.forget(departed + early)
        if live:
            snap = _snapshot(now, live, remaining, capacity)
            a, b = keep.decide(snap), drop.decide(snap)
            for field in ("level", "queue", "dscp"):
                assert np.array_equal(getattr(a, field), getattr(b, field)), f"step {step}: {field}"
            assert a.timers == b.timers, f"step {step}"
            decisions += 1
    assert decisions > 1000 and batch_no > 600
    held = {f.request for f in live}  # (the forgetting one freed the departed batches' pruned requests)
    assert keep.pruned_requests & held == drop.pruned_requests & held
    assert drop.pruned_requests <= keep.pruned_requests
    if drop_budget:
        assert keep.pruned_requests, "the run must exercise pruning"
    assert keep.state.sizes()["batches"] > 600  # (the batches some decision saw)
    assert drop.state.sizes()["batches"] < 80  # the live ones, and a few waiting


def test_a_live_batch_is_freed_once_its_flows_are_done():
    p = MfsPolicy()
    f = Flow.on_path("f", 1e6, [0], stage=Stage.REUSE, request="r", batch="b", deadline=1.0, layer=1)
    snap = _snapshot(0.0, [f], {"f": 1e6}, np.full(LINKS, 1e10))
    p.decide(snap)
    assert p.state.forget(["b", "never-seen"]) == []
    assert p.state.batch_index("b") == 0 and p.state.owners([f]) == [(0, 0, "r", 1.0, False)]
    p.on_complete(f, 0.1)
    assert p.state.forget([]) == ["b"]  # (pending since the first call)
    assert p.state.batch_index("b") is None and p.state.forget([]) == []
    # A batch of the same name coming back is a new batch, on the freed indices.
    g = Flow.on_path("g", 1e6, [0], stage=Stage.REUSE, request="r", batch="b", deadline=2.0, layer=1)
    p.decide(_snapshot(0.2, [g], {"g": 1e6}, np.full(LINKS, 1e10)))
    assert p.state.batch_index("b") == 0 and p.state.owners([g]) == [(0, 0, "r", 2.0, False)]
    assert p.state.sizes()["batches"] == p.state.sizes()["requests"] == 1


def test_requests_only_the_coordinator_named_are_freed_unless_pruned():
    p = MfsPolicy()
    p.set_order({"b0": 0}, pruned=["x", "y"])
    p.set_order({"b0": 0}, pruned=["y"])  # x is no longer pruned: nothing keeps it
    p.forget([])
    assert p.pruned_requests == {"y"} and p.state.sizes()["requests"] == 2
    p.set_order({"b0": 0}, pruned=["y", "z"])  # z takes x's freed entry
    assert p.pruned_requests == {"y", "z"} and p.state.sizes()["requests"] == 2
