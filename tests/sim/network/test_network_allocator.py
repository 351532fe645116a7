"""Rate allocation: textbook max-min cases, strict priority, caps, ties and
rounding slivers, and a brute-force reference on random instances. Every
test runs on both paths of ``allocate``: the C module and the NumPy
reference (``test_network_allocator_paths`` compares the two bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.sim.network import allocator
from laxflow.sim.network.allocator import Usage, allocate


@pytest.fixture(autouse=True, params=["native", "numpy"])
def path(request, monkeypatch):
    """Run the test on the C path and on the NumPy reference."""
    if request.param == "native" and not allocator.NATIVE:
        pytest.skip("the C allocation module is not built")
    monkeypatch.setattr(allocator, "NATIVE", request.param == "native")
    return request.param


def make_usage(flows: list[dict[int, float]]) -> Usage:
    """Usage from one {link: weight} dict per flow."""
    ptr, link, weight = [0], [], []
    for f in flows:
        for l, w in f.items():
            link.append(l)
            weight.append(w)
        ptr.append(len(link))
    return Usage(np.array(ptr, dtype=np.int64), np.array(link, dtype=np.int64), np.array(weight, dtype=float))


def paths(*ps: list[int]) -> Usage:
    return make_usage([{l: 1.0 for l in p} for p in ps])


def run(capacity, usage, level=None, cap=None):
    n = usage.num_flows
    level = np.zeros(n, dtype=np.int64) if level is None else np.asarray(level, dtype=np.int64)
    cap = np.full(n, np.inf) if cap is None else np.asarray(cap, dtype=float)
    return allocate(np.asarray(capacity, dtype=float), usage, level, cap)


def test_one_link_equal_shares():
    np.testing.assert_allclose(run([1.0], paths([0], [0], [0])), [1 / 3] * 3)


def test_two_links_long_flow_bottlenecked_on_the_small_link():
    # L0 cap 1 shared by f0 (L0, L1) and f1 (L0); L1 cap 2 shared by f0 and f2.
    rates = run([1.0, 2.0], paths([0, 1], [0], [1]))
    np.testing.assert_allclose(rates, [0.5, 0.5, 1.5])


def test_parking_lot():
    # A long flow over three unit links, one short flow on each link.
    rates = run([1.0, 1.0, 1.0], paths([0, 1, 2], [0], [1], [2]))
    np.testing.assert_allclose(rates, [0.5, 0.5, 0.5, 0.5])


def test_bottleneck_elsewhere_frees_capacity():
    # L0 cap 10 (f0, f1), L1 cap 2 (f1, f2): f1 and f2 are held to 1 by L1,
    # so f0 takes the 9 left on L0.
    rates = run([10.0, 2.0], paths([0], [0, 1], [1]))
    np.testing.assert_allclose(rates, [9.0, 1.0, 1.0])


def test_bertsekas_gallager_example():
    # Links of capacity 1, 1, 1 and 2 (B&G Data Networks, max-min example shape):
    # f0: L0 L1 L2, f1: L0, f2: L1 L3, f3: L3 only, f4: L2.
    rates = run([1.0, 1.0, 1.0, 2.0], paths([0, 1, 2], [0], [1, 3], [3], [2]))
    # L0, L1, L2 all split 1/2; f3 takes the rest of L3.
    np.testing.assert_allclose(rates, [0.5, 0.5, 0.5, 1.5, 0.5])


def test_weighted_group_counts_its_weight_per_link():
    # A group loading L0 with half its rate competes with a flow on L0 (cap 1):
    # progressive filling raises both to r with 0.5 r + r = 1.
    rates = run([1.0], make_usage([{0: 0.5}, {0: 1.0}]))
    np.testing.assert_allclose(rates, [2 / 3, 2 / 3])


def test_rate_cap_is_honoured_and_leftover_redistributed():
    rates = run([1.0, 1.0], paths([0], [0], [0, 1]), cap=[0.1, np.inf, np.inf])
    np.testing.assert_allclose(rates, [0.1, 0.45, 0.45])


def test_zero_cap_gets_nothing():
    np.testing.assert_allclose(run([1.0], paths([0], [0]), cap=[0.0, np.inf]), [0.0, 1.0])


def test_strict_priority_lower_level_sees_only_the_residual():
    # f0 (level 0) takes all of L0. f1 (level 1, L0+L1) gets nothing, so f2
    # (level 1, L1) gets all of L1.
    rates = run([1.0, 1.0], paths([0], [0, 1], [1]), level=[0, 1, 1])
    np.testing.assert_allclose(rates, [1.0, 0.0, 1.0])


def test_strict_priority_capped_high_level_leaves_the_rest():
    rates = run([1.0], paths([0], [0], [0]), level=[0, 3, 3], cap=[0.4, np.inf, np.inf])
    np.testing.assert_allclose(rates, [0.4, 0.3, 0.3])


def test_level_numbers_need_not_be_dense():
    a = run([1.0, 1.0], paths([0], [0, 1], [1]), level=[0, 7, 7])
    b = run([1.0, 1.0], paths([0], [0, 1], [1]), level=[5, 100, 100])
    np.testing.assert_allclose(a, b)


def test_tied_links_freeze_in_the_same_round():
    # f crosses A (cap 0.3, with a1 and a2) and B (cap 0.2, with h). Both fair
    # shares are 0.1 in exact arithmetic; in floats A's is 0.3/3 =
    # 0.09999999999999999 and B's 0.2/2 = 0.1. As ties they freeze together:
    # h gets B's share. Broken by rounding, A would freeze first and h would
    # get the leftover 0.2 - 0.3/3 = 0.10000000000000002 one round later.
    rates = run([0.3, 0.2], paths([0, 1], [0], [0], [1]))
    assert rates.tolist() == [0.3 / 3, 0.3 / 3, 0.3 / 3, 0.2 / 2]
    assert 0.2 / 2 != 0.2 - 0.3 / 3


def test_tied_cap_freezes_with_its_link():
    # The cap equals the link's fair share in exact arithmetic (0.1), one ulp
    # above it in floats: the capped flow freezes as capped, with the others.
    rates = run([0.3], paths([0], [0], [0]), cap=[0.1, np.inf, np.inf])
    assert rates.tolist() == [0.3 / 3] * 3


def test_a_saturated_link_leaves_no_sliver_to_lower_levels():
    # Seven equal flows fill a 25 GB/s link at level 0; adding up their
    # shares in floats leaves 3.8e-6 B/s "free". The level-1 flow must get
    # exactly 0, not a rate that would take 10^9 years to finish its bytes.
    capacity = 25e9
    assert capacity - sum([capacity / 7] * 7) > 0  # the rounding residue exists
    rates = run([capacity], paths(*[[0]] * 8), level=[0] * 7 + [1])
    assert rates[7] == 0.0 and rates[:7].tolist() == [capacity / 7] * 7


def test_a_sliver_after_kept_levels_is_snapped_too():
    capacity = np.array([25e9])
    usage = paths(*[[0]] * 8)
    level = np.array([0] * 7 + [1])
    full = allocate(capacity, usage, level, np.full(8, np.inf))
    again = allocate(capacity, usage, level, np.full(8, np.inf), from_level=1, prev_rate=full)
    assert again[7] == 0.0 and again.tolist() == full.tolist()


def test_a_lone_flow_leaves_no_sliver_to_lower_levels():
    # One flow of weight 0.7 alone at level 0 gets 25e9 / 0.7, and 0.7 times
    # that leaves 3.8e-6 B/s of the link in floats: the level-1 flow behind
    # it must get exactly 0 here too (the allocator's one-flow path).
    capacity, weight = 25e9, 0.7
    assert capacity - weight * (capacity / weight) > 0  # the rounding residue exists
    usage = make_usage([{0: weight}, {0: 1.0}])
    rates = run([capacity], usage, level=[0, 1])
    assert rates.tolist() == [capacity / weight, 0.0]


def reference(capacity, flows, level, cap):
    """Brute force: global progressive filling, one level at a time, tiny steps
    replaced by the exact next saturation point (one bottleneck per round)."""
    capacity = np.array(capacity, dtype=float)
    n = len(flows)
    rates = np.zeros(n)
    for lev in sorted(set(level)):
        members = [i for i in range(n) if level[i] == lev]
        frozen: set[int] = set()
        t = 0.0
        while len(frozen) < len(members):
            active = [i for i in members if i not in frozen]
            # Next event: a link saturates or a flow hits its cap.
            best = np.inf
            for l in range(capacity.size):
                w = sum(flows[i].get(l, 0.0) for i in active)
                if w > 0:
                    best = min(best, t + capacity[l] / w)
            for i in active:
                best = min(best, cap[i])
            dt = best - t
            for l in range(capacity.size):
                capacity[l] -= dt * sum(flows[i].get(l, 0.0) for i in active)
            t = best
            for i in active:
                rates[i] = t
            for i in active:
                tight = any(capacity[l] <= 1e-9 for l in flows[i])
                if tight or cap[i] <= t + 1e-12:
                    frozen.add(i)
        capacity = np.maximum(capacity, 0.0)
    return rates


@pytest.mark.parametrize("seed", range(25))
def test_random_instances_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    num_links = int(rng.integers(2, 7))
    n = int(rng.integers(1, 12))
    capacity = rng.uniform(0.5, 4.0, num_links)
    flows = []
    for _ in range(n):
        k = int(rng.integers(1, num_links + 1))
        links = rng.choice(num_links, k, replace=False)
        flows.append({int(l): float(rng.choice([1.0, rng.uniform(0.1, 1.0)])) for l in links})
    level = [int(x) for x in rng.integers(0, 3, n)]
    cap = [float(rng.uniform(0.05, 2.0)) if rng.random() < 0.3 else np.inf for _ in range(n)]
    got = allocate(capacity, make_usage(flows), np.array(level), np.array(cap))
    np.testing.assert_allclose(got, reference(capacity, flows, level, cap), rtol=1e-7, atol=1e-9)
    # Feasible: no link over capacity.
    load = make_usage(flows).link_load(got, num_links)
    assert np.all(load <= capacity * (1 + 1e-9))


def test_partial_recompute_equals_full():
    rng = np.random.default_rng(7)
    num_links, n = 40, 300
    usage = make_usage(
        [{int(l): 1.0 for l in rng.choice(num_links, int(rng.integers(1, 5)), replace=False)} for _ in range(n)]
    )
    capacity = rng.uniform(1, 3, num_links)
    level = rng.integers(0, 4, n)
    cap = np.where(rng.random(n) < 0.2, 0.05, np.inf)
    full = allocate(capacity, usage, level, cap)
    # Change only the flows of levels >= 2; levels 0 and 1 keep their rates.
    level2 = level.copy()
    level2[level >= 2] = 5 - level[level >= 2]
    expect = allocate(capacity, usage, level2, cap)
    got = allocate(capacity, usage, level2, cap, from_level=2, prev_rate=full)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_every_flow_has_a_bottleneck_on_a_leaf_spine(seed):
    """The max-min characterisation, checked on larger instances: each flow of
    level k is at its cap or crosses a link saturated by levels <= k on which
    no flow of level k is faster."""
    from laxflow.sim.network import leaf_spine

    topo = leaf_spine(64, 8, 10.0, oversubscription=3.0, num_spines=4)
    rng = np.random.default_rng(100 + seed)
    n = 400
    src = rng.integers(0, 64, n)
    dst = (src + rng.integers(1, 64, n)) % 64
    pair, link = topo.route_many(src, dst)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(pair, minlength=n))]).astype(np.int64)
    usage = Usage(ptr, link, rng.choice([1.0, 0.5, 0.25], link.size))
    level = rng.integers(0, 3, n)
    cap = np.where(rng.random(n) < 0.1, rng.uniform(0.1, 2.0, n), np.inf)
    rate = allocate(topo.capacity, usage, level, cap)
    entry_flow = usage.entry_flow()
    for k in range(3):
        upto = np.where(level <= k, rate, 0.0)
        load = usage.link_load(upto, topo.num_links)
        assert np.all(load <= topo.capacity * (1 + 1e-9))
        saturated = load >= topo.capacity * (1 - 1e-9)
        # Fastest level-k flow on each link.
        fastest = np.zeros(topo.num_links)
        mine = level[entry_flow] == k
        np.maximum.at(fastest, usage.link[mine], rate[entry_flow[mine]])
        for f in np.flatnonzero(level == k):
            links = usage.link[ptr[f] : ptr[f + 1]]
            at_cap = rate[f] >= cap[f] * (1 - 1e-9)
            bottleneck = np.any(saturated[links] & (rate[f] >= fastest[links] * (1 - 1e-9)))
            assert at_cap or bottleneck, f"flow {f} (level {k}) has no bottleneck"
