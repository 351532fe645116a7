"""MFS caches a flow's bottleneck per frozen (read-only) usage arrays, the
serving simulator's shared transfer shapes: the cached facts equal the
computed ones, for both decision paths (the C core and the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.policy import Flow, Snapshot, Stage
from laxflow.policy.mfs import MfsPolicy


def frozen(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("native", [True, False])
def test_cached_bottlenecks_equal_computed_ones(native):
    rng = np.random.default_rng(2)
    capacity = rng.uniform(1.0, 3.0, 12)
    shapes = [(np.sort(rng.choice(12, 4, replace=False)), rng.uniform(0.5, 2.0, 4)) for _ in range(3)]
    frozen_shapes = [(frozen(lk), frozen(w)) for lk, w in shapes]
    policies = []
    for use in (shapes, frozen_shapes):
        policy = MfsPolicy()
        policy.native = native
        flows = [
            Flow(f"f{i}", 1e3, *use[i % 3], stage=Stage.P2D, request=f"r{i}", batch=f"b{i % 2}", deadline=1.0, layer=0,
                 current_layer=0)
            for i in range(6)
        ]
        snap = Snapshot(now=0.0, flows=flows, remaining=np.full(6, 1e3), capacity=capacity,
                        link_load=np.zeros(12), load_window=0.01)
        policy.decide(snap)
        policies.append(policy)
    plain, cached = policies
    assert len(cached._bneck_cache) == 3 and not plain._bneck_cache
    for attr in ("bneck_link", "bneck_rate", "bneck_weight"):
        assert np.array_equal(getattr(plain.rmlq, attr), getattr(cached.rmlq, attr)), attr
