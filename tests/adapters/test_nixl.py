"""laxflow.adapters.nixl against real NIXL: two processes, UCX over TCP on lo, DRAM buffers.

The target agent runs in nixl_target.py; the initiator is this process's
agent, wrapped afresh by each test (and the remote agent loaded again, so
each wrapper learns its connection).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from segment_daemon import SegmentDaemon

from laxflow.adapters.gate import GateConfig
from laxflow.adapters.nixl import NixlAdapterConfig, NixlAgent
from laxflow.adapters.sockets import tcp_sockets
from laxflow.errors import UserError
from laxflow.protocol.shm import EventKind, Gate, Stage

nixl_api = pytest.importorskip("nixl._api", reason="nixl not installed (make nixl)")

SIZE = 2 << 20
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
# NIXL 1.5.1's UCX ib modules load the host's libibverbs providers, which bring Debian's
# libnl-route-3 beside the wheel's own copy: the process then dies of SIGSEGV at exit
# (rtnl_tc_unregister in the second copy's destructor), after every test passed. No ib
# module, no second copy; UCX reads this once per process, when it first loads modules.
os.environ["UCX_MODULES"] = "^ib*"


@pytest.fixture(scope="module")
def peer():
    """The target process and this process's (inner) agent, both on UCX's TCP transport over lo."""
    env = {**os.environ, **UCX_ENV}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("nixl_target.py")), str(2 * SIZE)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    saved = {k: os.environ.get(k) for k in UCX_ENV}
    os.environ.update(UCX_ENV)  # read once, when UCX's context is made
    try:
        agent = nixl_api.nixl_agent(f"lxf-init-{os.getpid()}", nixl_api.nixl_agent_config(backends=["UCX"]))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    local = np.zeros(2 * SIZE, np.uint8)
    agent.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")
    info = json.loads(proc.stdout.readline())

    def ask(line: str) -> str:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    yield {"agent": agent, "local": local, "info": info, "ask": ask,
           "metadata": bytes.fromhex(info["metadata"]), "descs": bytes.fromhex(info["descs"])}
    proc.stdin.write("quit\n")
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def wrap(peer):
    """Wrap the agent with a gate on ``shm_name``; load the target; remove it again afterwards."""
    made: list[NixlAgent] = []

    def make(shm_name: str, **kw) -> tuple[NixlAgent, str]:
        eng = NixlAgent(peer["agent"], config=NixlAdapterConfig(gate=GateConfig(shm_name=shm_name, reattach_s=0.05),
                                                                **kw))
        made.append(eng)
        return eng, eng.add_remote_agent(peer["metadata"])

    yield make
    for eng in made:
        eng.close()
        for name in list(eng._peers):
            eng.remove_remote_agent(name)


def remote_range(eng: NixlAgent, peer, offset: int, n: int):
    return eng.get_xfer_descs([(peer["info"]["addr"] + offset, n, 0)], "DRAM")


def local_range(eng: NixlAgent, peer, offset: int, n: int):
    return eng.get_xfer_descs([(peer["local"].ctypes.data + offset, n, 0)], "DRAM")


def wait_state(eng: NixlAgent, handle, timeout: float = 20.0) -> str:
    end = time.monotonic() + timeout
    while (state := eng.check_xfer_state(handle)) == "PROC" and time.monotonic() < end:
        time.sleep(0.002)
    return state


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def missing_name() -> str:
    return f"/lxf-nixl-none-{os.getpid()}-{time.monotonic_ns()}"


def test_fail_open_without_daemon_moves_the_bytes(peer, wrap):
    eng, target = wrap(missing_name())
    local = peer["local"]
    assert "no such segment" in eng.gate.bypass_reason
    local[:SIZE] = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)
    h = eng.initialize_xfer("WRITE", local_range(eng, peer, 0, SIZE), remote_range(eng, peer, SIZE, SIZE), target,
                            b"w1", request=1, layer=2)
    assert eng.transfer(h) in ("PROC", "DONE")
    assert wait_state(eng, h) == "DONE"
    assert peer["ask"](f"sha {SIZE} {SIZE}") == sha(local[:SIZE])
    eng.release_xfer_handle(h)
    # and back: a READ of the target's first half (its i % 251 pattern)
    local[:SIZE] = 0
    h = eng.initialize_xfer("READ", local_range(eng, peer, 0, SIZE), remote_range(eng, peer, 0, SIZE), target)
    eng.transfer(h)
    assert wait_state(eng, h) == "DONE"
    assert np.array_equal(local[:SIZE], (np.arange(SIZE) % 251).astype(np.uint8))
    eng.release_xfer_handle(h)
    assert eng.gate.stats["bypassed"] == 2 and eng.gate.stats["released"] == 0
    assert [(r.op, r.nbytes, r.msg_id, r.status) for r in eng.records] == [("WRITE", SIZE, 0, "DONE"),
                                                                          ("READ", SIZE, 0, "DONE")]
    assert "w1" in json.loads(peer["ask"]("notifs 1"))  # NIXL's notification still reaches the target


def test_held_transfer_waits_while_the_permitted_one_goes(peer, wrap):
    """Request 2 is announced first but held; request 1, permitted, moves its bytes; then request 2 goes."""

    def decide(ev):
        return (Gate.OPEN, 1, 38) if ev["request_id"] == 1 else None

    daemon = SegmentDaemon(decide)
    try:
        eng, target = wrap(daemon.name)
        local = peer["local"]
        local[:] = np.random.default_rng(2).integers(0, 256, 2 * SIZE, dtype=np.uint8)
        before_low = peer["ask"](f"sha {SIZE} {SIZE}")
        low = eng.initialize_xfer("WRITE", local_range(eng, peer, SIZE, SIZE), remote_range(eng, peer, SIZE, SIZE),
                                  target, request=2, stage=Stage.P2D, layer=5)
        high = eng.initialize_xfer("WRITE", local_range(eng, peer, 0, SIZE), remote_range(eng, peer, 0, SIZE),
                                   target, request=1, stage=Stage.P2D, layer=5)
        assert eng.transfer(low) == "PROC"
        daemon.wait_for(lambda evs: any(e["request_id"] == 2 and e["kind"] == EventKind.SUBMIT for e in evs))
        eng.transfer(high)
        assert wait_state(eng, high) == "DONE"
        assert peer["ask"](f"sha 0 {SIZE}") == sha(local[:SIZE])
        time.sleep(0.05)
        assert eng.check_xfer_state(low) == "PROC", "the held transfer ran without its permit"
        assert peer["ask"](f"sha {SIZE} {SIZE}") == before_low  # none of its bytes arrived
        low_submit = next(e for e in daemon.of_kind(EventKind.SUBMIT) if e["request_id"] == 2)
        daemon.open(low_submit["msg_id"], level=5, dscp=34)
        assert wait_state(eng, low) == "DONE"
        assert peer["ask"](f"sha {SIZE} {SIZE}") == sha(local[SIZE:])
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == 2)
        done = [e for e in daemon.of_kind(EventKind.COMPLETION)]
        assert [e["request_id"] for e in done] == [1, 2]
        assert all(e["bytes"] == SIZE and e["stage"] == Stage.P2D and e["layer"] == 5 for e in done)
        assert done[1]["msg_id"] == low_submit["msg_id"]
        assert [(r.request, r.level, r.dscp) for r in eng.records] == [(1, 1, 38), (2, 5, 34)]
        assert eng.gate.stats["released"] == 2 and eng.gate.stats["failopen"] == 0
    finally:
        daemon.close()


def test_stale_daemon_releases_the_waiting_transfer(peer, wrap):
    daemon = SegmentDaemon(lambda ev: None)  # never grants
    try:
        eng, target = wrap(daemon.name)
        local = peer["local"]
        local[:4096] = 0
        h = eng.initialize_xfer("READ", local_range(eng, peer, 0, 4096), remote_range(eng, peer, 0, 4096), target,
                                request=9)
        eng.transfer(h)
        daemon.wait_for(lambda evs: any(e["kind"] == EventKind.SUBMIT for e in evs))
        time.sleep(0.05)
        assert eng.check_xfer_state(h) == "PROC"
        daemon.hang()  # its heartbeat goes stale: the gate fails open
        assert wait_state(eng, h) == "DONE"
        assert local[:4096].any() and peer["ask"]("sha 0 4096") == sha(local[:4096])
        assert eng.gate.stats["failopen"] == 1
        assert daemon.of_kind(EventKind.SUBMIT)[0]["stage"] == Stage.REUSE  # reads default to stage 1
    finally:
        daemon.close()


def test_prepped_requests_count_the_selected_descriptors_and_take_thread_tags(peer, wrap):
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 2, 30))
    try:
        eng, target = wrap(daemon.name)
        base, addr = peer["local"].ctypes.data, peer["info"]["addr"]
        blocks = [(base + i * 8192, 8192 if i % 2 else 4096, 0) for i in range(4)]
        remote = [(addr + i * 8192, 8192 if i % 2 else 4096, 0) for i in range(4)]
        local_side = eng.prep_xfer_dlist("NIXL_INIT_AGENT", blocks, "DRAM")
        remote_side = eng.prep_xfer_dlist(target, remote, "DRAM")
        eng.tagger = lambda notif: {"request": int(notif.split(b":")[0])}
        with eng.tags(layer=7, stage=Stage.REUSE):
            h = eng.make_prepped_xfer("READ", local_side, [1, 2, 3], remote_side, [1, 2, 3], notif_msg=b"44:1")
            eng.transfer(h)  # the notification given at make time is what the tagger reads
        assert wait_state(eng, h) == "DONE"
        eng.release_xfer_handle(h)
        eng.release_dlist_handle(local_side)
        eng.release_dlist_handle(remote_side)
        submit = daemon.of_kind(EventKind.SUBMIT)[0]
        assert (submit["request_id"], submit["bytes"], submit["layer"], submit["stage"]) == (44, 8192 + 4096 + 8192,
                                                                                           7, Stage.REUSE)
    finally:
        daemon.close()


def test_bad_arguments_are_refused(peer, wrap):
    eng, target = wrap(missing_name())
    with pytest.raises(TypeError, match="laxflow adds"):
        eng.initialize_xfer("READ", local_range(eng, peer, 0, 64), remote_range(eng, peer, 0, 64), target,
                            requets=1)
    with pytest.raises(ValueError, match="stage: expected 0..3"):
        eng.initialize_xfer("READ", local_range(eng, peer, 0, 64), remote_range(eng, peer, 0, 64), target, stage=7)
    with pytest.raises(ValueError, match="operation: expected 'WRITE' or 'READ'"):
        eng.initialize_xfer("PUT", local_range(eng, peer, 0, 64), remote_range(eng, peer, 0, 64), target)
    with pytest.raises(ValueError, match="request: expected an integer >= 0"):
        with eng.tags(request=-1):
            pass
    with pytest.raises(UserError, match="ib_traffic_class: expected 0..255"):
        NixlAdapterConfig(ib_traffic_class=300)
    with pytest.raises(UserError, match="UCX_IB_TRAFFIC_CLASS: expected 0..255 or 'auto'"):
        NixlAdapterConfig.from_env({"UCX_IB_TRAFFIC_CLASS": "af41"})
    assert NixlAdapterConfig.from_env({"UCX_IB_TRAFFIC_CLASS": "106"}).ib_traffic_class == 106
    assert NixlAdapterConfig.from_env({"UCX_IB_TRAFFIC_CLASS": "auto"}).ib_traffic_class is None


def test_ib_traffic_class_goes_to_the_ucx_backend_the_wrapper_builds():
    """The class UCX puts on RoCE QPs is the agent's: the UCX backend is made with it (``engine_config``)."""
    cfg = NixlAdapterConfig(gate=GateConfig(shm_name=missing_name()), ib_traffic_class=106)
    eng = NixlAgent(name=f"lxf-tc-{os.getpid()}", config=cfg)
    try:
        assert eng.get_backend_params("UCX")["engine_config"] == "IB_TRAFFIC_CLASS=106"
        assert "UCX" in eng.backends
    finally:
        eng.close()
    with pytest.raises(UserError, match="name: expected"):
        NixlAgent(config=cfg)


def test_gated_transfer_over_ucx_shared_memory():
    """UCX_TLS=sm: the bytes go by shared memory (CMA), gated the same; no TCP connection to mark.

    UCX's shared-memory transports have no peer failure handler, so both agents'
    UCX backends are made with ``ucx_error_handling_mode: none`` (NIXL's default,
    ``peer``, makes NIXL 1.5.1 fail with NIXL_ERR_BACKEND: "no active messages
    transport ... sysv/memory - no peer failure handler").
    """
    env = {**os.environ, "UCX_TLS": "sm"}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("nixl_target.py")), str(SIZE), "sm"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 0, 46))
    saved = os.environ.get("UCX_TLS")
    os.environ["UCX_TLS"] = "sm"
    try:
        inner = nixl_api.nixl_agent(f"lxf-sm-{os.getpid()}", nixl_api.nixl_agent_config(backends=[]))
        inner.create_backend("UCX", {"ucx_error_handling_mode": "none"})
    finally:
        os.environ.pop("UCX_TLS") if saved is None else os.environ.__setitem__("UCX_TLS", saved)
    eng = NixlAgent(inner, config=NixlAdapterConfig(gate=GateConfig(shm_name=daemon.name)))
    try:
        info = json.loads(proc.stdout.readline())
        target = eng.add_remote_agent(bytes.fromhex(info["metadata"]))
        local = np.random.default_rng(6).integers(0, 256, SIZE, dtype=np.uint8)
        eng.register_memory([(local.ctypes.data, SIZE, 0, "")], "DRAM")
        h = eng.initialize_xfer("WRITE", eng.get_xfer_descs([(local.ctypes.data, SIZE, 0)], "DRAM"),
                                eng.get_xfer_descs([(info["addr"], SIZE, 0)], "DRAM"), target, request=8, layer=1)
        assert eng.transfer(h) == "PROC"
        assert wait_state(eng, h) == "DONE"
        proc.stdin.write(f"sha 0 {SIZE}\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == sha(local)
        daemon.wait_for(lambda evs: any(e["kind"] == EventKind.COMPLETION for e in evs))
        assert [(e["request_id"], e["bytes"], e["layer"]) for e in daemon.of_kind(EventKind.SUBMIT)] == [(8, SIZE, 1)]
        assert [(r.dscp, r.marked) for r in eng.records] == [(46, 0)]  # permitted; nothing on a wire to mark
    finally:
        eng.close()
        daemon.close()
        proc.stdin.write("quit\n")
        proc.stdin.close()
        proc.wait(timeout=30)


scapy_all = pytest.importorskip("scapy.all")
from wire_capture import WireCapture, first_sends  # noqa: E402


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
def test_permit_dscp_on_the_wire_for_ucx_tcp(peer, wrap):
    """UCX's TCP connection to the target carries the permit's DSCP: the WRITE's data packets, all of them."""
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 2, 37) if ev["request_id"] == 3 else (Gate.OPEN, 4, 12))
    capture = None
    try:
        eng, target = wrap(daemon.name)
        addr = eng._peers[target].addr
        assert addr is not None and addr[0] == "127.0.0.1", "UCX's connection to the target was not found"
        local = peer["local"]
        local[:SIZE] = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8)
        capture = WireCapture("lo")
        for request in (3, 4):
            h = eng.initialize_xfer("WRITE", local_range(eng, peer, 0, SIZE), remote_range(eng, peer, 0, SIZE),
                                    target, request=request)
            eng.transfer(h)
            assert wait_state(eng, h) == "DONE"
            eng.release_xfer_handle(h)
        time.sleep(0.2)
        captured = capture.stop()
        assert capture.drops == 0
        assert peer["ask"](f"sha 0 {SIZE}") == sha(local[:SIZE])
        ours = {s.local[1] for s in tcp_sockets() if s.remote == addr}  # (the target's own loopback ep goes there too)
        data = [p for p in captured if (p.dst, p.dport) == addr and p.sport in ours and p.payload > 0]
        # UCX's wireup messages for the connection just loaded may still be on their way when the
        # capture starts (seen under load: a 74- and a 9-byte message), unmarked, before any permit.
        # From the first marked packet on, every byte is marked; before it, no WRITE data went.
        sends = first_sends(data)
        first = next((i for i, (p, _) in enumerate(sends) if p.dscp != 0), len(sends))
        assert all(p.payload < 128 for p, _ in sends[:first]), sends[:first]
        per_dscp: dict[int, int] = {}
        for p, fresh in sends[first:]:
            per_dscp[p.dscp] = per_dscp.get(p.dscp, 0) + fresh
        assert per_dscp.get(37, 0) >= SIZE and per_dscp.get(12, 0) >= SIZE, per_dscp
        assert set(per_dscp) == {37, 12}, per_dscp  # nothing of either WRITE left unmarked
        assert all(r.marked >= 1 for r in eng.records)  # (connections of earlier tests to the target count too)
        # A READ: the request leaves on our end, marked; the data comes back on the target's end of the
        # connection, in the target's class (its process has no wrapper here: DSCP 0).
        capture = WireCapture("lo")
        h = eng.initialize_xfer("READ", local_range(eng, peer, SIZE, SIZE), remote_range(eng, peer, 0, SIZE), target,
                                request=3)
        eng.transfer(h)
        assert wait_state(eng, h) == "DONE"
        eng.release_xfer_handle(h)
        time.sleep(0.2)
        captured = capture.stop()
        assert capture.drops == 0 and np.array_equal(local[SIZE:], local[:SIZE])
        back = [p for p in captured if (p.src, p.sport) == addr and p.payload > 0]
        assert sum(p.payload for p in back) >= SIZE and {p.dscp for p in back} == {0}
        out = [p for p in captured if (p.dst, p.dport) == addr and p.sport in ours and p.payload > 0]
        first = next((i for i, p in enumerate(out) if p.dscp == 37), len(out))  # (control messages before it)
        assert out[first:] and {p.dscp for p in out[first:]} == {37}, out
    finally:
        if capture is not None and capture.sock.fileno() >= 0:
            capture.stop()
        daemon.close()


def test_many_threads_post_through_one_wrapper(peer, wrap):
    """NIXL calls from the caller's threads and the wrapper's workers share the agent safely."""
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, ev["request_id"] % 3, 10 + ev["request_id"] % 3))
    try:
        eng, target = wrap(daemon.name)
        local = peer["local"]
        local[:] = np.random.default_rng(4).integers(0, 256, 2 * SIZE, dtype=np.uint8)
        chunk = SIZE // 8
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                h = eng.initialize_xfer("WRITE", local_range(eng, peer, i * chunk, chunk),
                                        remote_range(eng, peer, i * chunk, chunk), target, request=i + 1, layer=i)
                eng.transfer(h)
                assert wait_state(eng, h) == "DONE"
                eng.release_xfer_handle(h)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert peer["ask"](f"sha 0 {16 * chunk}") == sha(local[: 16 * chunk])
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == 16)
        assert sorted(e["layer"] for e in daemon.of_kind(EventKind.COMPLETION)) == list(range(16))
    finally:
        daemon.close()
