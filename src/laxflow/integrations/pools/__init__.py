"""Elastic instance pools of a PD-disaggregated cluster (Arrow and baselines), pure; see ``base.py``."""

from laxflow.integrations.pools.base import (
    DECODE_POOLS,
    PREFILL_POOLS,
    ClusterSnapshot,
    Pool,
    PoolDecision,
    PoolInstance,
    PoolManager,
    PoolMove,
    PoolRequest,
    apply_moves,
    flip_to_decode,
    flip_to_prefill,
    settle,
)
from laxflow.integrations.pools.monitor import TokenIntervalMonitor
from laxflow.integrations.pools.registry import (
    create_pool_manager,
    pool_manager_class,
    pool_manager_names,
    register_pool_manager,
)

__all__ = [
    "DECODE_POOLS", "PREFILL_POOLS", "ClusterSnapshot", "Pool", "PoolDecision", "PoolInstance", "PoolManager", "PoolMove", "PoolRequest",
    "TokenIntervalMonitor", "apply_moves", "create_pool_manager", "flip_to_decode", "flip_to_prefill",
    "pool_manager_class", "pool_manager_names", "register_pool_manager", "settle",
]
