"""Name -> policy class, loaded lazily.

Built-in policies are listed here as ``module:Class`` strings and imported only
when asked for, so ``laxflow --help`` does not import every policy. A name may
also be given directly as ``module:Class`` for an out-of-tree policy. Names are
unique: registering one twice is an error, not a silent override.
"""

from __future__ import annotations

import importlib
from typing import Any

from laxflow.policy.base import FlowPolicy

_BUILTIN: dict[str, str] = {
    "fs": "laxflow.policy.fair_sharing:FairSharing",
    "sjf": "laxflow.policy.sjf:ShortestJobFirst",
    "edf": "laxflow.policy.edf:EarliestDeadlineFirst",
    "mfs": "laxflow.policy.mfs:MfsPolicy",
    "dp-ideal": "laxflow.policy.dp_ideal:DeferAndPromoteIdeal",
    "karuna": "laxflow.policy.karuna:Karuna",
}
_LOADED: dict[str, type[FlowPolicy]] = {}


def register_policy(name: str, target: str | type[FlowPolicy]) -> None:
    """Add a policy under ``name`` (a class or a lazy ``module:Class``)."""
    if name in _BUILTIN or name in _LOADED:
        raise ValueError(f"policy {name!r} is already registered")
    if isinstance(target, str):
        _BUILTIN[name] = target
    else:
        _LOADED[name] = target


def available_policies() -> list[str]:
    return sorted(set(_BUILTIN) | set(_LOADED))


def _import(target: str) -> type[FlowPolicy]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"policy {target!r}: expected a registered name or module:Class")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"policy {target!r} cannot be loaded: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, FlowPolicy)):
        raise ValueError(f"policy {target!r} is not a laxflow.policy.FlowPolicy subclass")
    return cls


def policy_class(name: str) -> type[FlowPolicy]:
    """The class for ``name``; raises ValueError naming the valid choices."""
    if name in _LOADED:
        return _LOADED[name]
    if name in _BUILTIN:
        cls = _import(_BUILTIN[name])
        _LOADED[name] = cls
        return cls
    if ":" in name:
        return _import(name)
    raise ValueError(f"unknown policy {name!r} (expected one of {', '.join(available_policies())} or module:Class)")


def create_policy(name: str, **config: Any) -> FlowPolicy:
    """A fresh instance of policy ``name`` (one per network / run)."""
    return policy_class(name)(**config)
