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
    Envelope,
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
    # Other modules (laxflow.protocol.hooks) register their own types on the same codec: only this module's here.
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


def _mutated(msg, path, value) -> bytes:
    raw = _raw(msg)
    node = raw["body"]
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return msgpack.packb(raw)


@pytest.mark.parametrize(
    "msg, path, value, bound",
    [
        # a prompt no model has: the longest context windows are ~10 M tokens
        (m.BatchArrival("n1", sample_batch()), ("batch", "requests", 0, "prompt_tokens"), 2**63 - 1, str(2**24)),
        (m.BatchArrival("n1", sample_batch()), ("batch", "requests", 0, "reused_tokens"), 2**24 + 1, str(2**24)),
        (m.BatchArrival("n1", sample_batch()), ("batch", "requests", 0, "traffic", 0, "nbytes"), 2.0**60, str(2**50)),
        (m.Hello("n1", "start", (m.PortInfo("n1/p0", 12.5e9),), ()), ("ports", 0, "bandwidth"), 1e300, str(2**50)),
        (m.Heartbeat("n1", 7, 2, "coordinated", "c1", 3, ()), ("batches",), 2**40, str(2**32)),
        (m.Heartbeat("n1", 7, 2, "coordinated", "c1", 3, ()), ("seq",), 2**64 - 1, str(2**63 - 1)),  # past int64
        (m.Heartbeat("n1", 7, 2, "coordinated", "c1", 3, ()), ("applied_seq",), -2, "-1"),
        (m.Heartbeat("n1", 7, 2, "coordinated", "c1", 3, (m.QueueDepth("n1/p0", 0, 3, 4096),)),
         ("queues", 0, "messages"), 2**33, str(2**32)),
        (m.Heartbeat("n1", 7, 2, "coordinated", "c1", 3, (m.QueueDepth("n1/p0", 0, 3, 4096),)),
         ("queues", 0, "level"), 300, "255"),
    ],
)
def test_counts_are_bounded_to_what_a_request_can_have(msg, path, value, bound):
    """2^63-1 tokens was accepted: every count is bounded, and the error names the field, the value and the bound."""
    with pytest.raises(ProtocolError) as info:
        decode(_mutated(msg, path, value))
    assert info.value.reason is DropReason.BAD_FIELD
    detail = info.value.detail
    assert path[-1] in detail and bound in detail, detail
    assert (str(value) in detail or repr(value) in detail), detail
    assert "\n" not in detail
    with pytest.raises(ProtocolError):  # the sender's own check refuses it too
        encode_bad(msg, path, value)


def encode_bad(msg, path, value):
    """``msg`` with ``path`` set to ``value`` through dataclasses.replace, then encoded (must raise)."""
    def set_in(obj, p):
        if not p:
            return value
        head, rest = p[0], p[1:]
        if isinstance(head, int):
            items = list(obj)
            items[head] = set_in(items[head], rest)
            return tuple(items)
        return dataclasses.replace(obj, **{head: set_in(getattr(obj, head), rest)})
    return encode(set_in(msg, path), "n1")


def test_the_largest_real_values_still_pass():
    big = m.RequestInfo("r", 1e9, 2**24, 2**24, (m.Transfer("a/p", "b/p", float(2**50)),))
    frame = encode(m.Hello("n1", "start", (m.PortInfo("n1/p0", float(2**50)),), (m.BatchInfo("b", 3600.0, (big,)),)), "n1")
    assert decode(frame).body.batches[0].requests[0].prompt_tokens == 2**24
    hb = m.Heartbeat("n1", 2**63 - 1, 2**32, "local", "", -1, (m.QueueDepth("n1/p0", 255, 2**32, 2**50),))
    assert decode(encode(hb, "n1")).body == hb


def test_a_field_added_with_a_default_may_be_left_out_by_an_older_sender():
    new = m.StatusResponse("c1", 900.0, 1000.0, -1, (), (), 0, 0, (), m.LatencySummary(0, 0, 0, 0, 0), {},
                           "curve", {"auth": 2})
    assert decode(encode(new, "c")).body == new
    raw = _raw(new)
    for key in ("auth", "handshake_failures"):  # what a coordinator of the first release sends
        del raw["body"][key]
    old = decode(msgpack.packb(raw)).body
    assert (old.auth, old.handshake_failures, old.seq) == ("", {}, -1)
    raw["body"]["surprise"] = 1  # an unknown field is still refused
    assert _reason(msgpack.packb(raw)) is DropReason.BAD_FIELD
    del raw["body"]["surprise"], raw["body"]["seq"]  # and so is a missing field without a default
    assert _reason(msgpack.packb(raw)) is DropReason.BAD_FIELD
    with pytest.raises(ProtocolError, match="auth"):
        encode(dataclasses.replace(new, auth="trust-me"), "c")


def _envelope(sender: str, msg_id: str):
    return decode(encode(m.StatusRequest(False), sender, msg_id=msg_id))


def test_duplicate_filter_memory_stays_flat_over_a_long_run():
    """A coordinator and its daemons exchange ~30 frames/s for months: the filter's
    memory must not grow with every frame (a 65,536-entry LRU of ids grew the
    soak's processes by ~400 KiB/min for over half an hour), and a replay of a
    frame from long ago is still caught."""
    import tracemalloc

    f = DuplicateFilter()
    streams = [("n1", "a1b2c3d4e5f6"), ("n2", "0f0e0d0c0b0a")]
    first = [_envelope(s, f"{p}-1") for s, p in streams]
    for env in first:
        assert not f.seen(env)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for rnd in range(40):  # 160,000 frames, as ids count up in new_msg_id's form
            for s, p in streams:
                for k in range(2000):
                    env = Envelope(1, f"{p}-{2 + rnd * 2000 + k:x}", "status_request", s, 0.0, None)
                    assert not f.seen(env)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 256 << 10, f"the duplicate filter grew by {grown >> 10} KiB over 160,000 frames"
    for env in first:
        assert f.seen(env)  # a replay of the very first frame, 80,000 frames later


def test_duplicate_filter_takes_reordered_ids_once():
    f = DuplicateFilter()
    for k in (1, 3, 2, 5, 4):
        assert not f.seen(_envelope("n1", f"cafe-{k:x}"))
    for k in (1, 2, 3, 4, 5):
        assert f.seen(_envelope("n1", f"cafe-{k:x}"))
    assert not f.seen(_envelope("n1", "beef-1"))  # another process of the same sender: its own ids
    assert not f.seen(_envelope("n1", "free-form id"))  # ids of another form: remembered as they are
    assert f.seen(_envelope("n1", "free-form id"))
