"""The two paths of ``allocate`` give the same rates bit for bit: the C
module (``allocate_native.c``) and the NumPy reference, on random instances
with ties, caps, several levels and partial recomputes."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.sim.network import allocator
from laxflow.sim.network.allocator import Usage, allocate


def make_usage(flows: list[dict[int, float]]) -> Usage:
    ptr, link, weight = [0], [], []
    for f in flows:
        link.extend(f)
        weight.extend(f.values())
        ptr.append(len(link))
    return Usage(np.array(ptr, dtype=np.int64), np.array(link, dtype=np.int64), np.array(weight, dtype=float))


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(40))
def test_native_and_numpy_paths_agree_bit_for_bit_on_small_instances(seed, monkeypatch):
    """Few flows on few links (the inputs the scalar path used to take)."""
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
    out = {}
    for native in (True, False):
        monkeypatch.setattr(allocator, "NATIVE", native)
        out[native] = [allocate(capacity, usage, level, cap),
                       allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev)]
    for a, b in zip(out[True], out[False]):
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
        out[native] = [
            allocate(capacity, usage, level, cap).tolist(),
            allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev).tolist(),
        ]
    assert out[True] == out[False]


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("spread", ["dense", "one short of n", "n", "sparse", "huge"])
@pytest.mark.parametrize("base", [-7, 0, 2**50])
def test_native_level_order_agrees_however_the_levels_spread(spread, base, monkeypatch):
    """The C path orders flows by level with a counting sort when the levels
    span fewer values than there are flows (a policy's dense levels) and a
    merge sort otherwise: either way NumPy's stable order, so the same rates,
    for levels anywhere in int64."""
    capacity, usage, _, cap, prev, _ = random_case(11)
    n = usage.num_flows
    rng = np.random.default_rng(len(spread))
    span = {"dense": 3, "one short of n": n - 1, "n": n, "sparse": 10 * n, "huge": 2**40}[spread]
    level = base + rng.integers(0, span, n)
    level[0], level[-1] = base, base + span - 1  # the whole span, so both sorts are reached
    out = {}
    for native in (True, False):
        monkeypatch.setattr(allocator, "NATIVE", native)
        from_level = int(np.sort(level)[n // 2])
        out[native] = [allocate(capacity, usage, level, cap).tolist(),
                       allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev).tolist()]
    assert n > 10 and out[True] == out[False]


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
def test_native_path_takes_the_numpy_dtypes_it_is_given():
    """Levels as int32 and a non-contiguous cap are converted, not misread."""
    capacity, usage, level, cap, _, _ = random_case(7)
    want = allocate(capacity, usage, level, cap)
    got = allocate(capacity, usage, level.astype(np.int32), np.repeat(cap, 2)[::2])
    assert got.tolist() == want.tolist()


def table_of(capacity: np.ndarray, usage: Usage, level: np.ndarray, cap: np.ndarray, prev: np.ndarray):
    """The engine's C flow table holding these flows, their decision and earlier rates."""
    from laxflow.sim.network._allocate_native import ffi, lib

    table = ffi.gc(lib.lxf_table_new(capacity.size, ffi.from_buffer("double[]", capacity), 1, 0.01), lib.lxf_table_free)
    for i in range(usage.num_flows):
        a, b = int(usage.ptr[i]), int(usage.ptr[i + 1])
        links, weights = usage.link[a:b].copy(), usage.weight[a:b].copy()
        assert lib.lxf_table_add(table, 1.0, 0.0, 1, 1.0, b - a, ffi.from_buffer("int64_t[]", links),
                                 ffi.from_buffer("double[]", weights)) == 0
    n = usage.num_flows
    changed, out = ffi.new("int64_t[]", 3 * n), ffi.new("int64_t[4]")
    level, cap = level.astype(np.int64), np.ascontiguousarray(cap)
    queue, dscp = np.zeros(n, np.int64), np.zeros(n, np.uint8)
    assert lib.lxf_table_decide(table, 0, ffi.from_buffer("int64_t[]", level), ffi.from_buffer("double[]", cap),
                                ffi.from_buffer("int64_t[]", queue), ffi.from_buffer("uint8_t[]", dscp), changed,
                                out) == 0
    for i in range(n):
        table.rate[i] = float(prev[i])
    return table, lib, ffi


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(60))
def test_flow_table_allocation_equals_allocate(seed):
    """The engine's allocation in its C table (each link its own slot, the
    links in use reference-counted) gives allocate's rates bit for bit, for
    a partial recompute from a level and a full one."""
    capacity, usage, level, cap, prev, from_level = random_case(seed)
    n = usage.num_flows
    for start, want in ((from_level, allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev)),
                        (0, allocate(capacity, usage, level, cap))):
        table, lib, _ = table_of(capacity, usage, level, cap, prev)
        assert lib.lxf_table_allocate(table, start, 1.0 - allocator.REL_EPS, 1.0 + allocator.REL_EPS,
                                      allocator.SATURATED_REL_EPS) == 0
        assert [table.rate[i] for i in range(n)] == want.tolist()


def _utilization(table) -> dict[int, float]:
    """The table's kept utilization, per link (each link in use once)."""
    got = {int(table.util_link[j]): table.util[j] for j in range(table.nutil)}
    assert len(got) == table.nutil, "a link kept twice"
    return got


def _link_utilization(usage: Usage, rate: np.ndarray, capacity: np.ndarray) -> dict[int, float]:
    load = usage.link_load(rate, capacity.size)
    return {int(link): load[link] / capacity[link] for link in np.unique(usage.link)}


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("odd", [None, np.inf, np.nan])
def test_flow_table_utilization_with_flows_at_rate_zero(seed, odd):
    """Flows at rate 0 (strict priority starves many) add nothing to a link's
    utilization, and the table skips them, except when some flow has a
    weight that is not finite (inf x 0 is NaN): then NumPy's NaNs, bit for bit."""
    capacity, usage, level, cap, prev, _ = random_case(seed)
    assert usage.num_flows >= 3  # (these seeds' instances)
    rate = allocate(capacity, usage, level, cap) + prev
    rate[::2] = 0.0
    if odd is not None:
        usage = Usage(usage.ptr, usage.link, usage.weight.copy())
        usage.weight[usage.ptr[2]] = odd  # a flow at rate 0
    table, lib, _ = table_of(capacity, usage, level, cap, rate)
    assert lib.lxf_table_util(table) == 0
    with np.errstate(invalid="ignore"):  # (inf x 0)
        want = _link_utilization(usage, rate, capacity)
    got = _utilization(table)
    assert got.keys() == want.keys()
    assert [np.float64(got[k]).tobytes() for k in got] == [np.float64(want[k]).tobytes() for k in got]
    if odd is not None:
        assert any(np.isnan(v) for v in got.values())


@pytest.mark.skipif(not allocator.NATIVE, reason="the C allocation module is not built")
@pytest.mark.parametrize("seed", range(20))
def test_flow_table_utilization_equals_numpy(seed):
    """The utilization the table keeps for the link-load average, once per
    link in use, is NumPy's link_load(rate)[link] / capacity[link], bit for
    bit, also after flows left (the links in use are counted down)."""
    capacity, usage, level, cap, prev, _ = random_case(seed)
    rate = allocate(capacity, usage, level, cap) + prev
    table, lib, _ = table_of(capacity, usage, level, cap, rate)
    assert lib.lxf_table_util(table) == 0
    assert _utilization(table) == _link_utilization(usage, rate, capacity)
    if usage.num_flows > 1:  # the first flow finishes: the rest's utilization without it
        out, low = np.zeros(usage.num_flows, np.int64), np.zeros(1, np.int64)
        table.remaining[0] = 0.0
        from laxflow.sim.network._allocate_native import ffi
        assert lib.lxf_table_complete(table, 1.0, 1e-9, 1e-12, ffi.from_buffer("int64_t[]", out),
                                      ffi.from_buffer("int64_t[]", low)) >= 1
        assert out[0] == 0
        lib.lxf_table_compact(table)
        rest = Usage(usage.ptr[1:] - usage.ptr[1], usage.link[usage.ptr[1]:], usage.weight[usage.ptr[1]:])
        assert lib.lxf_table_util(table) == 0
        assert _utilization(table) == _link_utilization(rest, rate[1:], capacity)
