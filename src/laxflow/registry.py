"""One name -> class registry, used by every family of pluggable classes.

Each family keeps one instance in its own ``registry.py``: flow policies
(``policy/registry.py``), prefill and batch schedulers
(``integrations/prefill/registry.py``), routers and pool managers; those
modules keep their public functions and delegate here. This module imports nothing of
laxflow, so the lowest layer (``policy``, pure) can use it.

Built-ins are ``module:Class`` strings imported on first use, so importing a
family does not import every implementation (``laxflow --help`` stays fast).
A name may also be given directly as ``module:Class`` for an out-of-tree
class. Every class, built-in, registered or out-of-tree, must subclass the
family's base class. Names are unique: registering one twice is an error, not
a silent override. Errors are ValueError with one line naming the thing and
the valid choices (the CLI turns them into its one-line error).
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> subclass of ``base`` for one family; ``kind`` names it in errors ("router", ...).

    ``base_name`` is how errors spell the base class (default: its module and name).
    """

    def __init__(self, kind: str, base: type[T], builtin: dict[str, str], *, base_name: str = "") -> None:
        self.kind = kind
        self.base = base
        self.base_name = base_name or f"{base.__module__}.{base.__qualname__}"
        self._builtin = dict(builtin)
        self._loaded: dict[str, type[T]] = {}

    def register(self, name: str, target: str | type[T]) -> None:
        """Add ``target`` (a class, or a ``module:Class`` imported on first use) under ``name``."""
        if name in self._builtin or name in self._loaded:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if isinstance(target, str):
            self._builtin[name] = target
        else:
            self._loaded[name] = self._check(name, target)

    def names(self) -> list[str]:
        return sorted(set(self._builtin) | set(self._loaded))

    def get(self, name: str) -> type[T]:
        """The class for a registered ``name`` or a ``module:Class``; raises ValueError naming the valid choices."""
        if name in self._loaded:
            return self._loaded[name]
        if name in self._builtin:
            cls = self._import(name, self._builtin[name])
            self._loaded[name] = cls
            return cls
        if ":" in name:
            return self._import(name, name)  # not kept: it is not a registered name
        raise ValueError(f"unknown {self.kind} {name!r} (expected one of {', '.join(self.names())} or module:Class)")

    def _import(self, name: str, target: str) -> type[T]:
        """The class ``target`` (``module:Class``) names; errors name ``name``, what the caller asked for."""
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise ValueError(f"{self.kind} {name!r}: expected a registered name or module:Class")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"{self.kind} {name!r} cannot be loaded: {exc}") from None
        return self._check(name, cls)

    def _check(self, name: str, cls: object) -> type[T]:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(f"{self.kind} {name!r} is not a {self.base_name} subclass")
        return cls
