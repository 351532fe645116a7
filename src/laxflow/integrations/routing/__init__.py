"""Request routers above the per-instance batch schedulers (pure); see ``base.py`` for the protocol."""

from laxflow.integrations.routing.base import InstanceView, QueuedPrefill, RouteDecision, Router
from laxflow.integrations.routing.registry import create_router, register_router, router_class, router_names

__all__ = ["InstanceView", "QueuedPrefill", "RouteDecision", "Router", "create_router", "register_router",
           "router_class", "router_names"]
