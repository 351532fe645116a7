"""Name -> prefill scheduler class, imported lazily; names are unique."""

from __future__ import annotations

import importlib

from laxflow.integrations.prefill.base import PrefillScheduler, TtftPredictor

_BUILTIN: dict[str, str] = {
    "flowprefill": "laxflow.integrations.prefill.flowprefill:FlowPrefill",
    "fcfs": "laxflow.integrations.prefill.fcfs:Fcfs",
    "edf-cp2k": "laxflow.integrations.prefill.edf:EdfChunked2k",
    "edf-cp8k": "laxflow.integrations.prefill.edf:EdfChunked8k",
    "edf-layer": "laxflow.integrations.prefill.edf:EdfLayer",
}
_LOADED: dict[str, type[PrefillScheduler]] = {}


def register_prefill_scheduler(name: str, target: str | type[PrefillScheduler]) -> None:
    """Add a scheduler under ``name`` (a class or a lazy ``module:Class``)."""
    if name in _BUILTIN or name in _LOADED:
        raise ValueError(f"prefill scheduler {name!r} is already registered")
    if isinstance(target, str):
        _BUILTIN[name] = target
    else:
        _LOADED[name] = target


def prefill_scheduler_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_LOADED))


def prefill_scheduler_class(name: str) -> type[PrefillScheduler]:
    """The class for ``name``; raises ValueError naming the valid choices."""
    if name not in _LOADED:
        if name not in _BUILTIN:
            raise ValueError(f"unknown prefill scheduler {name!r} (expected one of {', '.join(prefill_scheduler_names())})")
        module, _, attr = _BUILTIN[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module), attr)
    return _LOADED[name]


def create_prefill_scheduler(name: str, predictor: TtftPredictor, token_budget: int = 8192) -> PrefillScheduler:
    """A fresh scheduler (one per prefill instance)."""
    return prefill_scheduler_class(name)(predictor, token_budget)
