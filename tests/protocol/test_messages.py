"""The ZeroMQ wire codec: round trips, and every way a frame is refused."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from laxflow.protocol import messages as m
from laxflow.protocol.wire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    DropReason,
    DuplicateFilter,
    ProtocolError,
    decode,
    encode,
    message_types,
)


def sample_batch(bid: str = "b1", n: int = 2) -> m.BatchInfo:
    reqs = tuple(
        m.RequestInfo(
            id=f"{bid}-r{i}",
            deadline=1000.0 + i,
            prompt_tokens=512,
            reused_tokens=128,
            traffic=(m.Transfer("n1/p0", "n2/p0", 1e6 * (i + 1)), m.Transfer("n1/p1", "n3/p0", 0.0)),
        )
        for i in range(n)
    )
    return m.BatchInfo(id=bid, compute=0.02, requests=reqs)


def samples() -> list:
    ports = (m.PortInfo("n1/p0", 12.5e9), m.PortInfo("n1/p1", 12.5e9))
    queues = (m.QueueDepth("n1/p0", 0, 3, 4096), m.QueueDepth("n1/p0", 7, 0, 0))
    rank = m.BatchRank("b1", 0, 1000.5, 999.0, ("n1", "n2"))
    return [
        m.Hello("n1", "start", ports, (sample_batch("b1"), sample_batch("b2", 1))),
        m.Hello("n1", "resync", (), ()),
        m.Heartbeat("n1", 7, 2, "coordinated", "c1", 3, queues),
        m.BatchArrival("n1", sample_batch()),
        m.BatchDeparture("n1", "b1"),
        m.Welcome("c1", 0.5, 2.0),
        m.ResyncRequest("c1", "unknown daemon"),
        m.Decision("c1", 4, 1000.0, "arrival b1", (rank,), ("b1-r1",)),
        m.StatusRequest(True),
        m.StatusResponse(
            "c1", 900.0, 1000.0, 4,
            (m.DaemonStatus("n1", True, 0.1, 2, "coordinated", ports, queues),),
            (m.BatchStatus("b1", ("n1",), 2, 0.02, 0, 1000.5, 999.0),),
            1, 2, ("b1-r1",), m.LatencySummary(4, 0.3, 0.2, 0.9, 1.1), {"malformed": 3},
        ),
    ]


def test_every_message_type_has_a_sample():
    # Other modules (laxflow.hooks.messages) register their own types on the same codec: only this module's here.
    ours = {t for t, cls in message_types().items() if cls.__module__ == m.__name__}
    assert {type(s).TYPE for s in samples()} == ours


@pytest.mark.parametrize("msg", samples(), ids=lambda s: type(s).TYPE)
def test_round_trip(msg):
    frame = encode(msg, sender="n1", msg_id="id-1", ts=123.5)
    env = decode(frame)
    assert env.body == msg
    assert (env.v, env.msg_id, env.type, env.sender, env.ts) == (PROTOCOL_VERSION, "id-1", type(msg).TYPE, "n1", 123.5)
    assert dataclasses.is_dataclass(env.body) and type(env.body) is type(msg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.body.__setattr__(dataclasses.fields(msg)[0].name, None)


def test_msg_ids_are_unique():
    ids = {decode(encode(m.StatusRequest(False), "x")).msg_id for _ in range(1000)}
    assert len(ids) == 1000


def _raw(msg) -> dict:
    return msgpack.unpackb(encode(msg, "n1"), raw=False)


def _reason(frame: bytes) -> DropReason:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    return info.value.reason


@pytest.mark.parametrize(
    "frame",
    [b"", b"\xc1", b"\x81", b"garbage", msgpack.packb([1, 2, 3]), msgpack.packb(5), msgpack.packb({"x": 1}),
     msgpack.packb({1: 2}), b"\x91" * 100000],
)
def test_malformed(frame):
    assert _reason(frame) is DropReason.MALFORMED


def test_envelope_fields():
    good = _raw(m.BatchDeparture("n1", "b1"))
    for key, bad in [("msg_id", ""), ("msg_id", 5), ("msg_id", "x" * 65), ("sender", ""), ("sender", None),
                     ("ts", float("nan")), ("ts", "now"), ("ts", True), ("type", 3)]:
        assert _reason(msgpack.packb({**good, key: bad})) is DropReason.MALFORMED, key
    assert _reason(msgpack.packb({**good, "extra": 1})) is DropReason.MALFORMED
    assert _reason(msgpack.packb({k: v for k, v in good.items() if k != "body"})) is DropReason.MALFORMED


def test_unknown_version_and_type():
    good = _raw(m.BatchDeparture("n1", "b1"))
    assert _reason(msgpack.packb({**good, "v": PROTOCOL_VERSION + 1})) is DropReason.UNKNOWN_VERSION
    assert _reason(msgpack.packb({**good, "v": "1"})) is DropReason.UNKNOWN_VERSION
    assert _reason(msgpack.packb({**good, "v": True})) is DropReason.UNKNOWN_VERSION
    assert _reason(msgpack.packb({**good, "type": "launch_missiles"})) is DropReason.UNKNOWN_TYPE


@pytest.mark.parametrize(
    "body",
    [
        {"node": "n1"},  # missing field
        {"node": "n1", "batch_id": "b1", "extra": 0},
        {"node": 1, "batch_id": "b1"},
        {"node": "", "batch_id": "b1"},
        {"node": "n" * 300, "batch_id": "b1"},
        [1, 2],
    ],
)
def test_bad_fields(body):
    good = _raw(m.BatchDeparture("n1", "b1"))
    assert _reason(msgpack.packb({**good, "body": body})) is DropReason.BAD_FIELD


def test_bad_nested_values():
    good = _raw(m.BatchArrival("n1", sample_batch()))
    cases = []
    for path, value in [
        (("batch", "compute"), -1.0),
        (("batch", "compute"), float("inf")),
        (("batch", "requests"), []),
        (("batch", "requests", 0, "deadline"), "soon"),
        (("batch", "requests", 0, "prompt_tokens"), 1.5),
        (("batch", "requests", 0, "prompt_tokens"), -1),
        (("batch", "requests", 0, "traffic", 0, "nbytes"), -5),
        (("batch", "requests", 0, "traffic", 0, "src"), b"bytes"),
        (("batch", "requests", 1, "id"), "b1-r0"),  # duplicate request in a batch
    ]:
        raw = msgpack.unpackb(msgpack.packb(good), raw=False)
        node = raw["body"]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        cases.append(msgpack.packb(raw))
    assert [_reason(f) for f in cases] == [DropReason.BAD_FIELD] * len(cases)


def test_hello_and_heartbeat_values():
    with pytest.raises(ProtocolError, match="reason"):
        encode(m.Hello("n1", "whim", (), ()), "n1")
    with pytest.raises(ProtocolError, match="mode"):
        encode(m.Heartbeat("n1", 0, 0, "chaos", "", -1, ()), "n1")
    with pytest.raises(ProtocolError, match="bandwidth"):
        encode(m.Hello("n1", "start", (m.PortInfo("p", 0.0),), ()), "n1")
    with pytest.raises(ProtocolError, match="twice"):
        encode(m.Hello("n1", "start", (), (sample_batch(), sample_batch())), "n1")


def test_oversized():
    assert _reason(b"\x00" * (MAX_FRAME_BYTES + 1)) is DropReason.OVERSIZED
    big = m.Hello("n1", "start", (), tuple(sample_batch(f"b{i}", 32) for i in range(2000)))
    with pytest.raises(ProtocolError) as info:
        encode(big, "n1")
    assert info.value.reason is DropReason.OVERSIZED


def test_thousand_batches_fit():
    state = m.Hello("n1", "start", (), tuple(sample_batch(f"b{i}", 8) for i in range(1000)))
    assert decode(encode(state, "n1")).body == state


def test_encode_refuses_unregistered():
    @dataclasses.dataclass(frozen=True)
    class Stray:
        x: int

    with pytest.raises(ProtocolError) as info:
        encode(Stray(1), "n1")
    assert info.value.reason is DropReason.UNKNOWN_TYPE


def test_duplicate_msg_ids():
    f = DuplicateFilter(capacity=3)
    a = decode(encode(m.StatusRequest(False), "n1", msg_id="a"))
    a_other_sender = decode(encode(m.StatusRequest(False), "n2", msg_id="a"))
    assert not f.seen(a)
    assert f.seen(a)  # replay of the same frame
    assert not f.seen(a_other_sender)  # ids are per sender
    for k in "bcd":
        f.seen(decode(encode(m.StatusRequest(False), "n1", msg_id=k)))
    assert not f.seen(a)  # forgotten: bounded memory
