"""The one codec for everything laxflow sends over ZeroMQ.

Who calls it: the coordinator's loop (ROUTER and PUB sockets), the node
daemon's loop (DEALER and SUB), and ``laxflow status`` (DEALER). Every frame
goes through :func:`encode` on the way out and :func:`decode` on the way in;
nothing else in laxflow packs or unpacks a ZeroMQ frame.

Wire format (``PROTOCOL_VERSION`` 1): one ZeroMQ frame per message (a ROUTER
adds the peer identity in front of it), holding one msgpack map::

    {"v": 1, "msg_id": "<1..64 chars>", "type": "<message type>",
     "sender": "<1..256 chars>", "ts": <sender's wall clock, s>, "body": {...}}

``body`` holds the fields of the typed message class registered for ``type``
(:mod:`laxflow.protocol.schema`: the control plane's
:mod:`laxflow.protocol.messages`, the hooks' :mod:`laxflow.protocol.hooks`),
by name; nested records are maps too.
Decoding is strict: a missing, extra or mistyped field is ``bad_field``; the
one exception is a field added later with a default, which an older sender
may leave out (the receiver takes the default).
``PROTOCOL_VERSION`` changes only when the wire changes, independently of the
package version; a frame of another version is ``unknown_version``.

A frame longer than :data:`MAX_FRAME_BYTES` is refused before unpacking
(``oversized``). Sockets built by :mod:`laxflow.coordinator.client` also set
ZeroMQ's ``MAXMSGSIZE`` to :data:`SOCKET_MAX_BYTES`; a peer that sends more
than that is disconnected by ZeroMQ itself and never reaches the decoder.

Every way a frame can be refused is a :class:`DropReason`; the receiver
counts drops by reason (see :class:`DropCounter`) and goes on.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import threading
import time
import types
import typing
from collections import OrderedDict
from typing import Any, Callable, Union

import msgpack

# Imported for its registrations: decode() knows the control plane's messages whoever imports this first.
from laxflow.protocol import messages as _messages  # noqa: F401
# The table of message types (and the id bound), named here too for the codec's callers.
from laxflow.protocol.schema import MAX_ID_LEN, message, message_type, message_types  # noqa: F401

PROTOCOL_VERSION: int = 1
MAX_FRAME_BYTES: int = 8 * 1024 * 1024  # 1,000 batches x 32 requests fits with room to spare
SOCKET_MAX_BYTES: int = 4 * MAX_FRAME_BYTES  # beyond this ZeroMQ drops the peer (not counted here)
MAX_MSG_ID_LEN = 64
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_ENVELOPE_KEYS = frozenset({"v", "msg_id", "type", "sender", "ts", "body"})


class DropReason(str, enum.Enum):
    """Why a received frame was not delivered; metrics label values."""

    MALFORMED = "malformed"  # not msgpack, not a map, wrong frame count, bad envelope
    OVERSIZED = "oversized"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_TYPE = "unknown_type"
    BAD_FIELD = "bad_field"  # body does not match the message's schema
    DUPLICATE = "duplicate"  # msg_id already seen from this sender (DuplicateFilter)
    UNEXPECTED = "unexpected"  # a valid message this socket does not accept


class ProtocolError(Exception):
    """A frame that cannot be delivered; ``reason`` is what the caller counts."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class Envelope:
    """A decoded frame: envelope fields and the typed message."""

    v: int
    msg_id: str
    type: str
    sender: str
    ts: float
    body: Any  # an instance of the class registered for ``type``


# ------------------------------------------------------------------ fields

_SCHEMAS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _schema(cls: type) -> tuple[tuple[str, Any], ...]:
    schema = _SCHEMAS.get(cls)
    if schema is None:
        hints = typing.get_type_hints(cls)
        schema = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
        _SCHEMAS[cls] = schema
    return schema


# ------------------------------------------------------------------ encode

_counter_lock = threading.Lock()
_counter = 0
_prefix = os.urandom(6).hex()


def new_msg_id() -> str:
    """Unique per process and across processes: random prefix + counter."""
    global _counter
    with _counter_lock:
        _counter += 1
        return f"{_prefix}-{_counter:x}"


def _to_wire(value: Any) -> Any:
    enc = _ENCODERS.get(type(value))
    if enc is None:
        enc = _ENCODERS[type(value)] = _compile_encoder(type(value))
    return enc(value)


_ENCODERS: dict[type, Callable[[Any], Any]] = {}


def _compile_encoder(cls: type) -> Callable[[Any], Any]:
    """Dataclass -> nested dicts/lists, one closure per class (built once)."""
    parts = []
    for name, hint in _schema(cls):
        parts.append((name, _field_encoder(hint)))

    def enc(obj: Any) -> dict:
        return {name: (f(getattr(obj, name)) if f else getattr(obj, name)) for name, f in parts}

    return enc


def _field_encoder(hint: Any) -> Callable[[Any], Any] | None:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = _field_encoder(item)
        return (lambda v: [inner(x) for x in v]) if inner else list
    if origin is dict:
        return dict
    if origin in (Union, types.UnionType):
        (inner_hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _field_encoder(inner_hint)
        return (lambda v: None if v is None else inner(v)) if inner else None
    if dataclasses.is_dataclass(hint):
        return _compile_encoder(hint)
    return None  # scalars go as they are


def encode(msg: Any, sender: str, msg_id: str | None = None, ts: float | None = None, check: bool = True) -> bytes:
    """Pack ``msg`` (a registered message) into one frame.

    Validates the message first with the receiver's validator (the sender
    finds its own bugs, not the receiver); raises ProtocolError(BAD_FIELD /
    OVERSIZED) if it would not decode on the other side. ``check=False``
    skips that pass, for a hot path that sends what it built from validated
    input (the coordinator's Decision); the receiver still validates.
    """
    cls = type(msg)
    if message_type(getattr(cls, "TYPE", None)) is not cls:
        raise ProtocolError(DropReason.UNKNOWN_TYPE, f"{cls.__name__} is not a registered message")
    body = _to_wire(msg)
    if check:
        _check(cls, body, cls.TYPE)  # same validator as the receiver
    frame = msgpack.packb(
        {
            "v": PROTOCOL_VERSION,
            "msg_id": msg_id or new_msg_id(),
            "type": cls.TYPE,
            "sender": sender,
            "ts": time.time() if ts is None else ts,
            "body": body,
        },
        use_bin_type=True,
    )
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(DropReason.OVERSIZED, f"{cls.TYPE} is {len(frame)} bytes (max {MAX_FRAME_BYTES})")
    return frame


# ------------------------------------------------------------------ decode


def decode(frame: bytes | memoryview) -> Envelope:
    """Unpack and validate one frame; ProtocolError naming the first problem."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(DropReason.OVERSIZED, f"frame of {len(frame)} bytes (max {MAX_FRAME_BYTES})")
    try:
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several types (ExtraData, ValueError, StackError...)
        raise ProtocolError(DropReason.MALFORMED, f"not msgpack ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise ProtocolError(DropReason.MALFORMED, f"frame is a {type(raw).__name__}, expected a map")
    if "v" not in raw:
        raise ProtocolError(DropReason.MALFORMED, "envelope has no 'v'")
    v = raw["v"]
    if v != PROTOCOL_VERSION or isinstance(v, bool):
        raise ProtocolError(DropReason.UNKNOWN_VERSION, f"version {v!r} (this side speaks {PROTOCOL_VERSION})")
    keys = set(raw)
    if keys != _ENVELOPE_KEYS:
        missing, extra = sorted(_ENVELOPE_KEYS - keys), sorted(map(str, keys - _ENVELOPE_KEYS))
        raise ProtocolError(DropReason.MALFORMED, f"envelope keys: missing {missing}, unexpected {extra}")
    msg_id, type_name, sender, ts = raw["msg_id"], raw["type"], raw["sender"], raw["ts"]
    if not isinstance(msg_id, str) or not 0 < len(msg_id) <= MAX_MSG_ID_LEN:
        raise ProtocolError(DropReason.MALFORMED, "envelope 'msg_id' must be a string of 1..64 chars")
    if not isinstance(sender, str) or not 0 < len(sender) <= MAX_ID_LEN:
        raise ProtocolError(DropReason.MALFORMED, "envelope 'sender' must be a string of 1..256 chars")
    if not _is_number(ts):
        raise ProtocolError(DropReason.MALFORMED, "envelope 'ts' must be a finite number")
    if not isinstance(type_name, str):
        raise ProtocolError(DropReason.MALFORMED, "envelope 'type' must be a string")
    cls = message_type(type_name)
    if cls is None:
        raise ProtocolError(DropReason.UNKNOWN_TYPE, f"type {type_name[:64]!r}")
    body = _check(cls, raw["body"], type_name)
    return Envelope(v=v, msg_id=msg_id, type=type_name, sender=sender, ts=float(ts), body=body)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bad(where: str, what: str) -> ProtocolError:
    return ProtocolError(DropReason.BAD_FIELD, f"{where}: {what}")


class _Bad(Exception):
    """A field that does not fit; ``path`` grows as it propagates out."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.path: list[str] = []


def _check(cls: type, data: Any, where: str) -> Any:
    """Build ``cls`` from decoded ``data`` checking every field's type, then
    each record's own ``validate()`` (value ranges, cross-field rules)."""
    dec = _DECODERS.get(cls)
    if dec is None:
        dec = _DECODERS[cls] = _compile_decoder(cls)
    try:
        return dec(data)
    except _Bad as exc:
        raise _bad(where + "".join(reversed(exc.path)), exc.what) from None


_DECODERS: dict[Any, Callable[[Any], Any]] = {}


def _compile_decoder(hint: Any) -> Callable[[Any], Any]:
    """One checking converter per field type, built once; errors carry their path."""
    origin = typing.get_origin(hint)
    if hint is str:
        limit = MAX_ID_LEN * 16

        def dec_str(x: Any) -> str:
            if not isinstance(x, str) or len(x) > limit:
                raise _Bad(f"expected a string of at most {limit} chars, got {type(x).__name__}")
            return x

        return dec_str
    if hint is bool:

        def dec_bool(x: Any) -> bool:
            if not isinstance(x, bool):
                raise _Bad(f"expected a bool, got {type(x).__name__}")
            return x

        return dec_bool
    if hint is int:

        def dec_int(x: Any) -> int:
            if not isinstance(x, int) or isinstance(x, bool):
                raise _Bad(f"expected an integer, got {type(x).__name__}")
            if not _INT64_MIN <= x <= _INT64_MAX:  # msgpack carries uint64 too; nothing here needs more than int64
                raise _Bad(f"{x} is out of bounds: expected {_INT64_MIN}..{_INT64_MAX} (int64)")
            return x

        return dec_int
    if hint is float:

        def dec_float(x: Any) -> float:
            if not _is_number(x):
                raise _Bad(f"expected a finite number, got {type(x).__name__}")
            return float(x)

        return dec_float
    if origin is tuple:
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = _compile_decoder(item)

        def dec_tuple(x: Any) -> tuple:
            if not isinstance(x, list):
                raise _Bad(f"expected a list, got {type(x).__name__}")
            try:
                return tuple([inner(v) for v in x])
            except _Bad as exc:
                for i, v in enumerate(x):  # the failure path only: find the index
                    try:
                        inner(v)
                    except _Bad:
                        exc.path.append(f"[{i}]")
                        break
                raise

        return dec_tuple
    if origin is dict:
        kt, vt = (_compile_decoder(a) for a in typing.get_args(hint))

        def dec_dict(x: Any) -> dict:
            if not isinstance(x, dict):
                raise _Bad(f"expected a map, got {type(x).__name__}")
            return {kt(k): vt(v) for k, v in x.items()}

        return dec_dict
    if origin in (Union, types.UnionType):  # only ``X | None`` is used
        (inner_hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        inner_opt = _compile_decoder(inner_hint)
        return lambda x: None if x is None else inner_opt(x)
    if dataclasses.is_dataclass(hint):
        return _compile_record(hint)
    raise TypeError(f"protocol: unsupported field type {hint!r}")  # a bug in messages.py


def _compile_record(cls: type) -> Callable[[Any], Any]:
    fields = [(name, _compile_decoder(hint)) for name, hint in _schema(cls)]
    names = [n for n, _ in fields]
    # A field added to a message later has a default: a frame from an older sender may leave it out.
    optional = {f.name for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    validate = getattr(cls, "validate", None)

    def dec_record(x: Any) -> Any:
        if not isinstance(x, dict):
            raise _Bad(f"expected a map, got {type(x).__name__}")
        if len(x) != len(fields) or any(n not in x for n in names):
            missing = [n for n in names if n not in x and n not in optional]
            extra = sorted(str(k) for k in x if k not in names)
            if missing or extra:
                raise _Bad(f"fields: missing {missing}, unexpected {extra[:5]}")
        kwargs = {}
        for name, dec in fields:
            if name not in x:
                continue  # an optional field left out: its default
            try:
                kwargs[name] = dec(x[name])
            except _Bad as exc:
                exc.path.append(f".{name}")
                raise
        obj = cls(**kwargs)
        if validate is not None:
            try:
                obj.validate()
            except ValueError as exc:
                raise _Bad(str(exc)) from None
        return obj

    return dec_record


# ------------------------------------------------------------------ receiver helpers


class DuplicateFilter:
    """Drops a (sender, msg_id) pair seen before; memory per sending process, not per frame.

    Who calls it: a receiving loop, after :func:`decode`, on its own thread.
    A repeated pair is a retransmission or a replay; the loop drops it as
    ``DropReason.DUPLICATE``.

    Ids in :func:`new_msg_id`'s form (``<prefix>-<hex counter>``, one prefix
    per process) are kept per (sender, prefix) as the highest counter seen and
    a bit mask of the ``window`` counters below it: a counter inside the
    window is taken once, one below it is a replay (a sender's frames arrive
    in order over its connection, so only replays come that late). The last
    ``streams`` (sender, prefix) pairs are kept (a restarted process makes a
    new prefix). Ids of any other form are remembered as they are, the last
    ``capacity`` of them.
    """

    def __init__(self, capacity: int = 65536, window: int = 4096, streams: int = 4096) -> None:
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()  # other ids
        self._capacity = capacity
        self._window = window
        self._streams: OrderedDict[tuple[str, str], list[int]] = OrderedDict()  # -> [highest counter, mask]
        self._max_streams = streams

    def seen(self, env: Envelope) -> bool:
        """True if this (sender, msg_id) came before; records it otherwise."""
        prefix, _, tail = env.msg_id.rpartition("-")
        if prefix and 0 < len(tail) <= 16:
            try:
                counter = int(tail, 16)
            except ValueError:
                pass
            else:
                if tail == f"{counter:x}":  # the canonical spelling only: one counter, one id
                    return self._seen_counter((env.sender, prefix), counter)
        key = (env.sender, env.msg_id)
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return False

    def _seen_counter(self, stream: tuple[str, str], counter: int) -> bool:
        state = self._streams.get(stream)
        if state is None:
            self._streams[stream] = [counter, 1]
            if len(self._streams) > self._max_streams:
                self._streams.popitem(last=False)
            return False
        self._streams.move_to_end(stream)
        top, mask = state
        if counter > top:  # the usual case: the next id
            state[0] = counter
            state[1] = ((mask << (counter - top)) | 1) & ((1 << self._window) - 1) if counter - top < self._window else 1
            return False
        back = top - counter
        if back >= self._window or mask >> back & 1:
            return True
        state[1] = mask | 1 << back
        return False


class DropCounter:
    """Frames dropped, by reason: what a loop reports in metrics and status."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {r.value: 0 for r in DropReason}

    def add(self, reason: DropReason) -> None:
        self.counts[reason.value] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())
