"""10,000 random and mutated frames into the coordinator's ROUTER: no crash, every frame counted."""

from __future__ import annotations

import random
import time

import msgpack
import zmq
from cptest import CoordinatorProcess, TestDaemon, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laxflow.coordinator.client import request_status
from laxflow.protocol import messages as m
from laxflow.protocol.wire import MAX_FRAME_BYTES, PROTOCOL_VERSION, DropReason, encode

FRAMES = 10_000


def _valid_frames() -> list[bytes]:
    b = m.BatchInfo("b", 0.01, (request("r1", 1e9, 100.0, "f/p0", "f/p1"), request("r2", 1e9 + 1, 5.0, "f/p1", "f/p0")))
    msgs = [
        m.Hello("fz", "start", (m.PortInfo("f/p0", 1e9), m.PortInfo("f/p1", 1e9)), (b,)),
        m.Heartbeat("fz", 1, 1, "coordinated", "", -1, (m.QueueDepth("f/p0", 0, 1, 10),)),
        m.BatchArrival("fz", b),
        m.BatchDeparture("fz", "b"),
        m.StatusRequest(False),
        m.Decision("c", 0, 0.0, "x", (), ()),  # valid but not accepted on the ROUTER
    ]
    return [encode(x, "fz") for x in msgs]


VALID = _valid_frames()


def _pack(obj) -> bytes:
    try:
        return msgpack.packb(obj)
    except Exception:  # e.g. a dict key msgpack refuses: send the reserved byte instead
        return b"\xc1"

leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
tree = st.recursive(leaf, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=5), max_leaves=30)


@st.composite
def structural_mutation(draw) -> bytes:
    """Decode a valid frame, replace one value somewhere with a random one, re-encode."""
    obj = msgpack.unpackb(draw(st.sampled_from(VALID)), raw=False)
    node, path = obj, []
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append((node, key))
        node = node[key]
    if not path:
        obj["body"] = draw(tree)
    else:
        parent, key = path[-1]
        parent[key] = draw(tree)
    return _pack(obj)


@st.composite
def byte_mutation(draw) -> bytes:
    frame = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        i = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del frame[i:]
        else:
            frame[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(frame)


envelope = st.fixed_dictionaries(
    {"v": st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1, 0, "1"]), "msg_id": st.text(max_size=70),
     "type": st.sampled_from(["hello", "heartbeat", "batch_arrival", "nope", ""]), "sender": st.text(max_size=10),
     "ts": st.floats(), "body": tree}
).map(_pack)

single = st.binary(max_size=200) | tree.map(_pack) | envelope | structural_mutation() | byte_mutation() | st.sampled_from(VALID)
frames = single.map(lambda f: [f]) | st.lists(st.binary(max_size=20), min_size=2, max_size=3)


def _accounted(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items()
               if k.startswith(("laxflow_coordinator_frames_total{", "laxflow_coordinator_frames_dropped_total{")))


def test_fuzz_router(tmp_path):
    coordinator = CoordinatorProcess(tmp_path).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(coordinator.address)
    good = None
    try:
        base = _accounted(coordinator.metrics())
        sent = 0

        # lists of 50: hypothesis' per-example overhead would otherwise dominate the run
        @settings(max_examples=(FRAMES - 3) // 50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(frames, min_size=50, max_size=50))
        def fire(batch):
            nonlocal sent
            for parts in batch:
                sock.send_multipart(parts)
            sent += len(batch)

        fire()
        rng = random.Random(0)
        while sent < FRAMES - 3:  # hypothesis may stop short of max_examples: top up with byte flips
            frame = bytearray(rng.choice(VALID))
            frame[rng.randrange(len(frame))] ^= rng.randrange(1, 256)
            sock.send(bytes(frame))
            sent += 1
        sock.send(b"\x00" * (MAX_FRAME_BYTES + 1))  # oversized
        sock.send(VALID[3])
        sock.send(VALID[3])  # the same msg_id again: duplicate
        sent += 3

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = coordinator.metrics()
            if _accounted(metrics) - base >= sent:
                break
            time.sleep(0.2)
        assert _accounted(metrics) - base == sent == FRAMES  # each frame delivered or dropped by reason, once
        assert coordinator.proc.poll() is None  # still running
        for reason in DropReason:
            assert metrics[f"laxflow_coordinator_frames_dropped_total{{reason={reason.value}}}"] >= 1, reason
        assert metrics["laxflow_coordinator_internal_errors_total"] == 0
        s = request_status(coordinator.address)
        assert sum(s.dropped.values()) == sum(
            v for k, v in metrics.items() if k.startswith("laxflow_coordinator_frames_dropped_total{"))

        # and it still serves a real daemon
        good = TestDaemon(coordinator.address, "good", ["good/p0"])
        good.arrive(m.BatchInfo("real", 0.0, (request("rr", time.time() + 5, 1.0, "good/p0", "good/p0"),)))
        good.wait_for(lambda d: "real" in [r.batch_id for r in d.order])
    finally:
        if good is not None:
            good.close()
        sock.close()
        ctx.term()
        coordinator.stop()


def test_fuzz_daemon_link(tmp_path):
    """A daemon's CoordinatorLink fed 10,000 bad and mutated frames on its DEALER and SUB: all counted."""
    from laxflow.coordinator.client import CoordinatorLink

    address = f"ipc://{tmp_path}/coord"
    ctx = zmq.Context()
    router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
    router.bind(address)
    pub.bind(address + ".pub")
    link = CoordinatorLink(address, "n1", context=ctx)
    try:
        link.send(m.StatusRequest(False))
        identity, _ = router.recv_multipart()
        probe = encode(m.ResyncRequest("c", "probe"), "c")
        got = []
        while not got:  # PUB drops until the subscription has arrived
            pub.send(probe)
            got = link.receive(timeout_ms=50)
        sent = delivered = 0

        @settings(max_examples=FRAMES // 50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(frames, min_size=50, max_size=50), st.booleans())
        def fire(batch, via_pub):
            nonlocal sent, delivered
            for parts in batch:
                if via_pub:
                    pub.send_multipart(parts)
                else:
                    router.send_multipart([identity, *parts])
            sent += len(batch)
            delivered += len(link.receive(timeout_ms=0))

        before = link.drops.total
        fire()
        deadline = time.monotonic() + 30
        while delivered + link.drops.total - before < sent and time.monotonic() < deadline:
            delivered += len(link.receive(timeout_ms=100))
        assert sent == FRAMES
        assert delivered + link.drops.total - before == sent
        assert link.drops.counts["malformed"] > 0 and link.drops.counts["bad_field"] > 0
    finally:
        link.close()
        router.close(0)
        pub.close(0)
        ctx.term()


def test_impossible_counts_are_dropped_and_counted(tmp_path):
    """A batch whose request claims 2^63-1 prompt tokens reaches a real coordinator: dropped as bad_field,
    logged naming the field, the value and the bound, never in the view; the coordinator goes on."""
    coordinator = CoordinatorProcess(tmp_path).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(coordinator.address)
    try:
        sock.send(encode(m.Hello("big", "start", (m.PortInfo("big/p0", 1e9),), ()), "big"))
        huge = m.RequestInfo("huge-r", time.time() + 5, 2**63 - 1, 0, (m.Transfer("big/p0", "big/p0", 1.0),))
        sock.send(encode(m.BatchArrival("big", m.BatchInfo("huge", 0.0, (huge,))), "big", check=False))
        deadline = time.monotonic() + 10
        while coordinator.metrics()["laxflow_coordinator_frames_dropped_total{reason=bad_field}"] < 1:
            assert time.monotonic() < deadline, coordinator.log.read_text()
            time.sleep(0.05)
        s = request_status(coordinator.address)
        assert s.active_batches == 0 and [d.node for d in s.daemons] == ["big"]
        assert coordinator.proc.poll() is None
        line = [x for x in coordinator.log.read_text().splitlines() if "prompt_tokens" in x]
        assert line and str(2**63 - 1) in line[0] and str(2**24) in line[0], coordinator.log.read_text()
    finally:
        sock.close()
        ctx.term()
        coordinator.stop()


def test_a_daemon_report_past_the_bounds_is_counted_not_raised(tmp_path):
    """The daemon's uplink builds reports from shim counters the protocol bounds (bytes <= 2^50): one past
    them is logged and counted, never sent, and does not raise into the daemon's loop."""
    from laxflow.daemon.state import BatchReport
    from laxflow.daemon.uplink import Uplink

    class Core:  # what the uplink reads of a DaemonCore here
        ports = ()
        requests: dict = {}

    address = f"ipc://{tmp_path}/coord"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(address)
    up = Uplink(address, "n1", Core(), None, 0.5, lambda: 0.0)
    try:
        huge = BatchReport("arrival", "b", 0.0, {"r": 10.0}, 0.01, {"p0": {"r": 2.0**60}})
        fine = BatchReport("arrival", "c", 0.0, {"q": 10.0}, 0.01, {"p0": {"q": 1e6}})
        up.report([huge, fine])
        assert up.unsendable == 1 and list(up._batches) == ["c"]
        assert router.poll(5000)
        _, frame = router.recv_multipart()
        from laxflow.protocol.wire import decode

        assert decode(frame).body.batch.id == "c"
    finally:
        up.close()
        router.close(0)
        ctx.term()
