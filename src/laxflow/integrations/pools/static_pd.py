"""``static-pd`` pool manager: a fixed P/D split, min-load dispatch (Arrow's static baseline).

Prefill to the P instance with the least predicted queueing delay, decode to
the D instance with the fewest running tokens; no instance ever changes pool.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.prefill.base import TtftPredictor
from laxflow.integrations.prefill.iteration import build_config
from laxflow.integrations.pools.arrow import Arrow, ArrowConfig
from laxflow.integrations.pools.base import ClusterSnapshot, Pool, PoolDecision, PoolMove, PoolRequest


class StaticPd(Arrow):
    name = "static-pd"

    def __init__(self, predictor: TtftPredictor, config: ArrowConfig) -> None:
        super().__init__(predictor, config)

    @classmethod
    def from_profile(cls, samples: Sequence[tuple[float, float]], **options: Any) -> "StaticPd":
        return cls(TtftPredictor(samples, degree=2), build_config(ArrowConfig, options))

    def dispatch_prefill(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        t = self._least_delay(snapshot.pool(Pool.PREFILL))
        if t is None:
            raise ValueError("static-pd: the cluster snapshot has no instance in pool P")
        return PoolDecision(t.id)

    def dispatch_decode(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        t = self._least_tokens(snapshot.pool(Pool.DECODE))
        if t is None:
            raise ValueError("static-pd: the cluster snapshot has no instance in pool D")
        return PoolDecision(t.id)

    def rebalance(self, snapshot: ClusterSnapshot, now: float, tpot_slo: float) -> tuple[PoolMove, ...]:
        return ()
