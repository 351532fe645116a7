"""The scalar path of ``allocate`` (small inputs) gives the vectorized path's
rates bit for bit, on random instances with ties, caps, several levels and
partial recomputes."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.sim.network import allocator_scalar
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
    monkeypatch.setattr(allocator_scalar, "FEW_ENTRIES", 10**6)
    scalar = [allocate(capacity, usage, level, cap), allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev)]
    monkeypatch.setattr(allocator_scalar, "FEW_ENTRIES", -1)
    vector = [allocate(capacity, usage, level, cap), allocate(capacity, usage, level, cap, from_level=from_level, prev_rate=prev)]
    for a, b in zip(scalar, vector):
        assert a.tolist() == b.tolist()
