"""Name -> router class, imported lazily; names are unique (one :class:`laxflow.registry.Registry`)."""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.routing.base import Router
from laxflow.registry import Registry

_ROUTERS: Registry[Router] = Registry("router", Router, {
    "pab": "laxflow.integrations.routing.pab:PabRouter",
    "dplb": "laxflow.integrations.routing.dplb:DplbRouter",
    "gorouting": "laxflow.integrations.routing.gorouting:GoRouting",
    "minload": "laxflow.integrations.routing.minload:MinLoad",
})


def register_router(name: str, target: str | type[Router]) -> None:
    """Add a router under ``name`` (a class or a lazy ``module:Class``)."""
    _ROUTERS.register(name, target)


def router_names() -> list[str]:
    return _ROUTERS.names()


def router_class(name: str) -> type[Router]:
    """The class for ``name`` (or ``module:Class``); raises ValueError naming the valid choices."""
    return _ROUTERS.get(name)


def create_router(name: str, samples: Sequence[Any] = (), **options: Any) -> Router:
    """A fresh router (one per cluster front end); ``samples`` (BatchSample) fit routers that estimate time."""
    return router_class(name).from_profile(samples, **options)
