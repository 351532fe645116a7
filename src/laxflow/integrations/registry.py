"""One lazy name -> class registry for the integrations' families (prefill, routing, pools).

Built-ins are ``module:Class`` strings imported on first use, so importing a
family does not import every implementation. Names are unique: registering one
twice is an error, not a silent override. Each family's ``registry.py`` keeps
its public functions and delegates to one instance of this class.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

T = TypeVar("T")


class LazyRegistry(Generic[T]):
    """Name -> class for one family; ``kind`` names it in errors ("router", "pool manager", ...)."""

    def __init__(self, kind: str, builtin: dict[str, str]) -> None:
        self.kind = kind
        self._builtin = dict(builtin)
        self._loaded: dict[str, type[T]] = {}

    def register(self, name: str, target: str | type[T]) -> None:
        """Add ``target`` (a class or a lazy ``module:Class``) under ``name``."""
        if name in self._builtin or name in self._loaded:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if isinstance(target, str):
            self._builtin[name] = target
        else:
            self._loaded[name] = target

    def names(self) -> list[str]:
        return sorted(set(self._builtin) | set(self._loaded))

    def get(self, name: str) -> type[T]:
        """The class for ``name``; raises ValueError naming the valid choices."""
        if name not in self._loaded:
            if name not in self._builtin:
                raise ValueError(f"unknown {self.kind} {name!r} (expected one of {', '.join(self.names())})")
            module, _, attr = self._builtin[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module), attr)
        return self._loaded[name]
