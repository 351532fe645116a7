"""Name -> flow policy class, loaded lazily (one :class:`laxflow.registry.Registry`).

Built-in policies are listed here as ``module:Class`` strings and imported only
when asked for, so ``laxflow --help`` does not import every policy. A name may
also be given directly as ``module:Class`` for an out-of-tree policy. Names are
unique: registering one twice is an error, not a silent override.
"""

from __future__ import annotations

from typing import Any

from laxflow.policy.base import FlowPolicy
from laxflow.registry import Registry

_POLICIES: Registry[FlowPolicy] = Registry("policy", FlowPolicy, {
    "fs": "laxflow.policy.fair_sharing:FairSharing",
    "sjf": "laxflow.policy.sjf:ShortestJobFirst",
    "edf": "laxflow.policy.edf:EarliestDeadlineFirst",
    "mfs": "laxflow.policy.mfs:MfsPolicy",
    "dp-ideal": "laxflow.policy.dp_ideal:DeferAndPromoteIdeal",
    "karuna": "laxflow.policy.karuna:Karuna",
    "sjf-group": "laxflow.policy.sjf:ShortestGroupFirst",
    "karuna-group": "laxflow.policy.karuna:KarunaGroup",
}, base_name="laxflow.policy.FlowPolicy")


def register_policy(name: str, target: str | type[FlowPolicy]) -> None:
    """Add a policy under ``name`` (a class or a lazy ``module:Class``)."""
    _POLICIES.register(name, target)


def available_policies() -> list[str]:
    return _POLICIES.names()


def policy_class(name: str) -> type[FlowPolicy]:
    """The class for ``name`` (or ``module:Class``); raises ValueError naming the valid choices."""
    return _POLICIES.get(name)


def create_policy(name: str, **config: Any) -> FlowPolicy:
    """A fresh instance of policy ``name`` (one per network / run)."""
    return policy_class(name)(**config)
