"""Name -> router class, imported lazily; names are unique."""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from laxflow.integrations.routing.base import Router

_BUILTIN: dict[str, str] = {
    "pab": "laxflow.integrations.routing.pab:PabRouter",
    "dplb": "laxflow.integrations.routing.dplb:DplbRouter",
    "gorouting": "laxflow.integrations.routing.gorouting:GoRouting",
    "minload": "laxflow.integrations.routing.minload:MinLoad",
}
_LOADED: dict[str, type[Router]] = {}


def register_router(name: str, target: str | type[Router]) -> None:
    """Add a router under ``name`` (a class or a lazy ``module:Class``)."""
    if name in _BUILTIN or name in _LOADED:
        raise ValueError(f"router {name!r} is already registered")
    if isinstance(target, str):
        _BUILTIN[name] = target
    else:
        _LOADED[name] = target


def router_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_LOADED))


def router_class(name: str) -> type[Router]:
    """The class for ``name``; raises ValueError naming the valid choices."""
    if name not in _LOADED:
        if name not in _BUILTIN:
            raise ValueError(f"unknown router {name!r} (expected one of {', '.join(router_names())})")
        module, _, attr = _BUILTIN[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module), attr)
    return _LOADED[name]


def create_router(name: str, samples: Sequence[Any] = (), **options: Any) -> Router:
    """A fresh router (one per cluster front end); ``samples`` (BatchSample) fit routers that estimate time."""
    return router_class(name).from_profile(samples, **options)
