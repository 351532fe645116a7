"""Name -> pool manager class, imported lazily; names are unique (one :class:`laxflow.registry.Registry`)."""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.pools.base import PoolManager
from laxflow.registry import Registry

_MANAGERS: Registry[PoolManager] = Registry("pool manager", PoolManager, {
    "arrow": "laxflow.integrations.pools.arrow:Arrow",
    "static-pd": "laxflow.integrations.pools.static_pd:StaticPd",
    "round-robin": "laxflow.integrations.pools.round_robin:RoundRobin",
    # The paper's systems baselines (§7.1): they reshape the cluster (see vllm.py).
    "vllm": "laxflow.integrations.pools.vllm:VllmColocated",
    "vllm-disagg": "laxflow.integrations.pools.vllm:VllmDisaggregated",
})


def register_pool_manager(name: str, target: str | type[PoolManager]) -> None:
    """Add a pool manager under ``name`` (a class or a lazy ``module:Class``)."""
    _MANAGERS.register(name, target)


def pool_manager_names() -> list[str]:
    return _MANAGERS.names()


def pool_manager_class(name: str) -> type[PoolManager]:
    """The class for ``name`` (or ``module:Class``); raises ValueError naming the valid choices."""
    return _MANAGERS.get(name)


def create_pool_manager(name: str, samples: Sequence[tuple[float, float]], **options: Any) -> PoolManager:
    """A fresh manager (one per cluster); ``samples`` are ``(prompt tokens, TTFT seconds)`` (ArrowConfig options)."""
    return pool_manager_class(name).from_profile(samples, **options)
