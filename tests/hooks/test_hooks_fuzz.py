"""10,000 random and mutated frames into a real daemon's hooks socket: every one answered, none fatal."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import msgpack
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
from daemontest import DaemonProc  # noqa: E402

from laxflow.hooks import HooksClient  # noqa: E402
from laxflow.protocol import hooks as hm  # noqa: E402
from laxflow.protocol.wire import PROTOCOL_VERSION, decode, encode  # noqa: E402

FRAMES = 10_000
VALID = [encode(x, "fz") for x in (
    hm.RegisterRequest("r1", 1e9, 10, 0, 0),
    hm.BatchFormed("b1", ("r1",), 0.01, {"eth0": {"r1": 100.0}}),
    hm.Layer("b1", 0, "begin", False),
    hm.Submit(7, "r1", "reuse", 2, 1000.0, "", 0.0),
    hm.Progress(7, 10.0),
    hm.Complete(7),
    hm.WaitPermit(8, 0.0),
    hm.Dispatch("r1", (hm.Instance("i", 0.0, 0.1, 10.0, "eth0", 0.0),)),
    hm.PrunedQuery(),
    hm.Ack(True, ""),  # valid frame, not a request: answered with an error
)]


def _pack(obj) -> bytes:
    try:
        return msgpack.packb(obj)
    except Exception:
        return b"\xc1"


leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
tree = st.recursive(leaf, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=5),
                    max_leaves=30)


@st.composite
def mutated(draw) -> bytes:
    obj = msgpack.unpackb(draw(st.sampled_from(VALID)), raw=False)
    body = obj["body"]
    if isinstance(body, dict) and body and draw(st.booleans()):
        body[draw(st.sampled_from(sorted(body)))] = draw(tree)
    else:
        obj[draw(st.sampled_from(sorted(obj)))] = draw(tree)
    return _pack(obj)


envelope = st.fixed_dictionaries(
    {"v": st.sampled_from([PROTOCOL_VERSION, 2]), "msg_id": st.text(min_size=1, max_size=10),
     "type": st.sampled_from(["hooks_submit", "hooks_layer", "hooks_bind", "hooks_nope"]),
     "sender": st.text(min_size=1, max_size=5), "ts": st.floats(allow_nan=False, allow_infinity=False), "body": tree}
).map(_pack)
single = st.binary(max_size=200) | envelope | mutated() | st.sampled_from(VALID)
frames = single.map(lambda f: [f]) | st.lists(st.binary(max_size=20), min_size=2, max_size=3)


def test_fuzz_hooks_socket(tmp_path):
    d = DaemonProc(tmp_path)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = 0
    sock.connect(d.hooks)
    replies = 0

    def collect(backlog: int) -> None:
        # Keep fewer than the daemon's reply queue (ZeroMQ's HWM, 1000) outstanding, as a real client would.
        nonlocal replies
        while sent - replies > backlog:
            assert sock.poll(10_000), f"no reply ({replies} of {sent} answered): " + "".join(d.log[-30:])
            decode(sock.recv())  # every reply is itself a valid frame
            replies += 1

    try:
        sent = 0

        # Hypothesis shapes 2,000 frames (slow to generate on a busy box); seeded byte flips, cuts and
        # random bytes make up the rest of the 10,000.
        @settings(max_examples=2_000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(frames)
        def fire(parts):
            nonlocal sent
            sock.send_multipart(parts)
            sent += 1
            collect(200)

        fire()
        rng = random.Random(0)
        while sent < FRAMES:
            frame = bytearray(rng.choice(VALID))
            op = rng.randrange(3)
            if op == 0:
                frame[rng.randrange(len(frame))] ^= rng.randrange(1, 256)
            elif op == 1:
                del frame[rng.randrange(len(frame)):]
            else:
                frame = bytearray(rng.randbytes(rng.randrange(1, 64)))
            sock.send(bytes(frame))
            sent += 1
            collect(200)
        collect(0)
        assert replies == sent == FRAMES  # one answer per request, malformed or not
        assert d.proc.poll() is None
        with HooksClient(d.hooks) as hooks:
            assert hooks.status() is not None
        text = d.metrics()
        assert "laxflow_daemon_internal_errors_total" not in text or 'internal_errors_total{node="n1"} 0.0' in text
    finally:
        sock.close()
        ctx.term()
        d.cleanup()


def test_counts_past_what_a_request_can_have_are_refused(tmp_path):
    """A prompt of 2^63-1 tokens (and other impossible counts) through a real hooks socket: each refused with
    one line naming the field, the value and the bound, counted as a bad event; the daemon goes on."""
    cases = [
        (hm.RegisterRequest("r1", 1e9, 2**63 - 1, 0, 0), "prompt_tokens", 2**63 - 1, 2**24),
        (hm.RegisterRequest("r1", 1e9, 10, 2**24 + 1, 0), "reused_tokens", 2**24 + 1, 2**24),
        (hm.Layer("b1", 5000, "begin", False), "layer", 5000, 4095),
        (hm.Submit(7, "r1", "reuse", 4096, 1000.0, "", 0.0), "layer", 4096, 4095),
        (hm.Submit(7, "r1", "reuse", 2, 2.0**51, "", 0.0), "nbytes", 2.0**51, 2**50),
        (hm.Progress(7, 2.0**60), "bytes_done", 2.0**60, 2**50),
        (hm.BatchFormed("b1", ("r1",), 0.01, {"eth0": {"r1": 1e18}}), "traffic", 1e18, 2**50),
        (hm.Bind(2**40, 3, "eth0"), "pid", 2**40, 2**22),
        (hm.Complete(2**64 - 1), "msg_id", 2**64 - 1, 2**63 - 1),
    ]
    d = DaemonProc(tmp_path)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(d.hooks)
    try:
        for msg, field, value, bound in cases:
            sock.send(encode(msg, "fz", check=False))  # what a buggy or hostile client sends
            assert sock.poll(10_000), "".join(d.log[-30:])
            ack = decode(sock.recv()).body
            assert isinstance(ack, hm.Ack) and not ack.ok, (msg, ack)
            assert "bad_field" in ack.error and field in ack.error, ack.error
            assert (str(value) in ack.error or repr(value) in ack.error) and str(bound) in ack.error, ack.error
        with HooksClient(d.hooks) as hooks:  # still serving, and a real request is still accepted
            hooks.register_request("ok", 1e12, 2**24, 0)
            assert hooks.status() is not None
        assert d.proc.poll() is None
        assert f'laxflow_daemon_bad_events_total{{node="n1"}} {float(len(cases))}' in _wait_metric(d, len(cases))
    finally:
        sock.close()
        ctx.term()
        d.cleanup()


def _wait_metric(d, n: int) -> str:
    import time

    deadline = time.monotonic() + 5
    while True:  # the daemon refreshes its counters a few times a second
        text = d.metrics()
        if f'laxflow_daemon_bad_events_total{{node="n1"}} {float(n)}' in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)
