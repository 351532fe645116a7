"""The three paths of ``allocate`` give the same rates bit for bit: the C
module (``allocate_native.c``), the scalar path (small inputs without it) and
the vectorized NumPy path, on random instances with ties, caps, several
levels and partial recomputes."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.sim.network import allocator, allocator_scalar
from laxflow.sim.network.allocator import Usage, allocate


def make_usage(flows: list[dict[int, float]]) -> Usage:
    ptr, link, weight = [0], [], []
    for f in flows:
        link.extend(f)
        weight.extend(f.values())
        ptr.append(len(link))
    return Usage(np.array(ptr, dtype=np.int64), np.array(link, dtype=np.int64), np.array(weight, dtype=float))


@pytest.mark.parametrize("seed", range(40))
def test_scalar_and_vectorized_paths_agree_bit_for_bit(seed, monkeypatch):
    rng = np.random.default_rng(1000 + seed)
    num_links = int(rng.integers(1, 9))
    n = int(rng.integers(1, 14))
    capacity = rng.choice([1.0, 0.3, 0.2, 25e9, float(rng.uniform(0.5, 4.0))], num_links)
    flows = []
    for _ in range(n):
        links = rng.choice(num_links, int(rng.integers(1, min(num_links, 4) + 1)), replace=False)
        flows.append({int(l): float(rng.choice([1.0, 0.5, rng.uniform(0.1, 1.0)])) for l in links})
    usage = make_usage(flows)
    level = rng.integers(0, 3, n)
    cap = np.where(rng.random(n) < 0.3, rng.choice([0.1, float(rng.uniform(0.05, 2.0))], n), np.inf)
    prev = rng.uniform(0.0, 0.2, n)
    from_level = int(rng.integers(0, 3))
    monkeypatch.setattr(allocator, "NATIVE", False)
    monkeypatch.setattr(allocator_scalar, "FEW_ENTRIES", 10**6)
    scalar = [allocate(capacity, usage, level, cap), allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev)]
    monkeypatch.setattr(allocator_scalar, "FEW_ENTRIES", -1)
    vector = [allocate(capacity, usage, level, cap), allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev)]
    for a, b in zip(scalar, vector):
        assert a.tolist() == b.tolist()


def random_case(seed: int):
    """A random instance: links of mixed capacities, flows of 1-6 links with
    tied and odd weights, 1-4 levels, some caps, earlier rates, a from_level."""
    rng = np.random.default_rng(5000 + seed)
    num_links = int(rng.integers(1, 40))
    n = int(rng.integers(1, 60))
    capacity = rng.choice([1.0, 0.3, 0.2, 25e9, float(rng.uniform(0.5, 4.0))], num_links)
    flows = []
    for _ in range(n):
        links = rng.choice(num_links, int(rng.integers(1, min(num_links, 6) + 1)), replace=False)
        flows.append({int(l): float(rng.choice([1.0, 0.5, 3.0, rng.uniform(0.1, 1.0)])) for l in links})
    level = rng.integers(0, int(rng.integers(1, 5)), n)
    cap = np.where(rng.random(n) < 0.3, rng.choice([0.1, float(rng.uniform(0.05, 2.0))], n), np.inf)
    return capacity, make_usage(flows), level, cap, rng.uniform(0.0, 0.2, n), int(rng.integers(0, 4))


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(300))
def test_native_and_numpy_paths_agree_bit_for_bit(seed, monkeypatch):
    capacity, usage, level, cap, prev, from_level = random_case(seed)
    out = {}
    for native in (True, False):
        monkeypatch.setattr(allocator, "NATIVE", native)
        monkeypatch.setattr(allocator_scalar, "FEW_ENTRIES", -1)
        out[native] = [
            allocate(capacity, usage, level, cap).tolist(),
            allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev).tolist(),
        ]
    assert out[True] == out[False]


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
def test_native_path_takes_the_numpy_dtypes_it_is_given():
    """Levels as int32 and a non-contiguous cap are converted, not misread."""
    capacity, usage, level, cap, _, _ = random_case(7)
    want = allocate(capacity, usage, level, cap)
    got = allocate(capacity, usage, level.astype(np.int32), np.repeat(cap, 2)[::2])
    assert got.tolist() == want.tolist()


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(20))
def test_entry_utilization_in_c_equals_numpy(seed, monkeypatch):
    capacity, usage, level, cap, prev, _ = random_case(seed)
    rate = allocate(capacity, usage, level, cap) + prev
    c = usage.entry_utilization(rate, capacity)
    monkeypatch.setattr(allocator, "NATIVE", False)
    assert c.tolist() == usage.entry_utilization(rate, capacity).tolist()
    assert c.tolist() == (usage.link_load(rate, capacity.size)[usage.link] / capacity[usage.link]).tolist()


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(60))
def test_allocate_lists_equals_allocate(seed):
    """The engine's list entry point (levels, caps and earlier rates as Python
    lists, the CSR's C buffers made once) gives allocate's rates bit for bit,
    on a second call with the same Usage too."""
    capacity, usage, level, cap, prev, from_level = random_case(seed)
    buf = allocator.CapacityBuffer(capacity)
    for _ in range(2):
        got = allocator.allocate_lists(buf, usage, level.tolist(), cap.tolist(), from_level, prev.tolist())
        assert got == allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev).tolist()
        got = allocator.allocate_lists(buf, usage, level.tolist(), cap.tolist(), None, prev.tolist())
        assert got == allocate(capacity, usage, level, cap).tolist()


def test_allocate_lists_declines_what_it_cannot_pass(monkeypatch):
    """A non-int64 CSR or no C module: None (the engine then calls allocate)."""
    capacity, usage, level, cap, prev, _ = random_case(3)
    buf = allocator.CapacityBuffer(capacity)
    odd = Usage(usage.ptr.astype(np.int32), usage.link, usage.weight)
    assert allocator.allocate_lists(buf, odd, level.tolist(), cap.tolist(), None, prev.tolist()) is None
    monkeypatch.setattr(allocator, "NATIVE", False)
    assert allocator.allocate_lists(buf, usage, level.tolist(), cap.tolist(), None, prev.tolist()) is None
