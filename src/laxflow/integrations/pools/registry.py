"""Name -> pool manager class, imported lazily; names are unique."""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from laxflow.integrations.pools.base import PoolManager

_BUILTIN: dict[str, str] = {
    "arrow": "laxflow.integrations.pools.arrow:Arrow",
    "static-pd": "laxflow.integrations.pools.static_pd:StaticPd",
    "round-robin": "laxflow.integrations.pools.round_robin:RoundRobin",
}
_LOADED: dict[str, type[PoolManager]] = {}


def register_pool_manager(name: str, target: str | type[PoolManager]) -> None:
    """Add a pool manager under ``name`` (a class or a lazy ``module:Class``)."""
    if name in _BUILTIN or name in _LOADED:
        raise ValueError(f"pool manager {name!r} is already registered")
    if isinstance(target, str):
        _BUILTIN[name] = target
    else:
        _LOADED[name] = target


def pool_manager_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_LOADED))


def pool_manager_class(name: str) -> type[PoolManager]:
    """The class for ``name``; raises ValueError naming the valid choices."""
    if name not in _LOADED:
        if name not in _BUILTIN:
            raise ValueError(f"unknown pool manager {name!r} (expected one of {', '.join(pool_manager_names())})")
        module, _, attr = _BUILTIN[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module), attr)
    return _LOADED[name]


def create_pool_manager(name: str, samples: Sequence[tuple[float, float]], **options: Any) -> PoolManager:
    """A fresh manager (one per cluster); ``samples`` are ``(prompt tokens, TTFT seconds)`` (ArrowConfig options)."""
    return pool_manager_class(name).from_profile(samples, **options)
