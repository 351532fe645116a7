"""``round-robin`` pool manager: fixed P/D split, prefills and decodes each cycled over their pool.

Keeps one cursor per pool (its only state); instances are taken in id order.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.prefill.iteration import build_config
from laxflow.integrations.pools.arrow import ArrowConfig
from laxflow.integrations.pools.base import ClusterSnapshot, Pool, PoolDecision, PoolManager, PoolRequest


class RoundRobin(PoolManager):
    name = "round-robin"

    def __init__(self) -> None:
        self._next = {Pool.PREFILL: 0, Pool.DECODE: 0}

    @classmethod
    def from_profile(cls, samples: Sequence[tuple[float, float]], **options: Any) -> "RoundRobin":
        build_config(ArrowConfig, options)  # one option set for every pool manager; unused here
        return cls()

    def _cycle(self, pool: Pool, snapshot: ClusterSnapshot) -> PoolDecision:
        insts = sorted(snapshot.pool(pool), key=lambda i: i.id)
        if not insts:
            raise ValueError(f"round-robin: the cluster snapshot has no instance in pool {pool.value}")
        k = self._next[pool] % len(insts)
        self._next[pool] = k + 1
        return PoolDecision(insts[k].id)

    def dispatch_prefill(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        return self._cycle(Pool.PREFILL, snapshot)

    def dispatch_decode(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        return self._cycle(Pool.DECODE, snapshot)
