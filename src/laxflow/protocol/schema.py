"""The wire's table of message types: which classes may cross, under which ``type`` name.

The message modules (:mod:`laxflow.protocol.messages`, the control plane;
:mod:`laxflow.protocol.hooks`, the hooks) register their frozen dataclasses
with :func:`message` when they are imported; the codec
(:mod:`laxflow.protocol.wire`) finds a frame's class with
:func:`message_type`. The table is here, apart from the codec, so that the
message modules and the codec import it and not each other.
"""

from __future__ import annotations

MAX_ID_LEN = 256  # characters of an id: node, port, batch, request, sender

_TYPES: dict[str, type] = {}


def message(type_name: str):
    """Class decorator: register a frozen dataclass as wire message ``type_name``.

    Used by the message modules only; a duplicate name is a bug.
    """

    def wrap(cls: type) -> type:
        if type_name in _TYPES:
            raise RuntimeError(f"protocol: message type {type_name!r} registered twice")
        cls.TYPE = type_name  # type: ignore[attr-defined]
        _TYPES[type_name] = cls
        return cls

    return wrap


def message_type(type_name: str) -> type | None:
    """The class registered as ``type_name``, None if none is."""
    return _TYPES.get(type_name)


def message_types() -> dict[str, type]:
    """Registered message classes by wire type name (a copy)."""
    return dict(_TYPES)
