"""The Mooncake wrapper with real Mooncake engines over TCP on loopback.

Two engines in this process (P2P handshake, no metadata server); the
"daemon" is the test itself through the real shared-memory segment
(segment_daemon.SegmentDaemon).  Packets are captured on lo with scapy.
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
from laxflow.adapters.mooncake import PRIME_BYTES, TransferEngine
from laxflow.adapters.mooncake_config import MooncakeAdapterConfig, tent_priority
from laxflow.errors import UserError
from laxflow.protocol.shm import EventKind, Gate, Stage, TagKind

mooncake_engine = pytest.importorskip("mooncake.engine", reason="extra 'mooncake' not installed")

SIZE = 4 << 20


@pytest.fixture(scope="module")
def pair():
    """Two initialized Mooncake engines (a: initiator, b: target) and registered buffers."""
    a, b = mooncake_engine.TransferEngine(), mooncake_engine.TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    local = np.zeros(2 * SIZE, np.uint8)
    remote = (np.arange(2 * SIZE) % 251).astype(np.uint8)
    assert a.register_memory(local.ctypes.data, local.nbytes) == 0
    assert b.register_memory(remote.ctypes.data, remote.nbytes) == 0
    return {"a": a, "b": b, "local": local, "remote": remote, "target": f"127.0.0.1:{b.get_rpc_port()}"}


def wrap(pair, shm_name: str, **kw) -> TransferEngine:
    config = MooncakeAdapterConfig(gate=GateConfig(shm_name=shm_name, reattach_s=0.05), **kw)
    return TransferEngine(pair["a"], config, protocol="tcp")


def missing_name() -> str:
    return f"/lxf-adapters-none-{os.getpid()}-{time.monotonic_ns()}"


def test_fail_open_without_daemon_moves_the_bytes(pair):
    eng = wrap(pair, missing_name())
    local, remote = pair["local"], pair["remote"]
    try:
        assert "no such segment" in eng.gate.bypass_reason
        local[:] = 0
        rc = eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data, SIZE, request=1, layer=0)
        assert rc == 0
        assert np.array_equal(local[:SIZE], remote[:SIZE])
        # write back a changed block, asynchronously, then read it with the batch call
        local[:4096] = 7
        h = eng.batch_transfer_async_write(pair["target"], [local.ctypes.data], [remote.ctypes.data + SIZE], [4096],
                                           request=1, layer=1)
        assert eng.get_batch_transfer_status([h]) == 0
        assert (remote[SIZE : SIZE + 4096] == 7).all()
        assert eng.gate.stats["bypassed"] == 2 and eng.gate.stats["released"] == 0
        # Mooncake's own error comes back through the wrapper
        assert eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data + 2 * SIZE - 8, 64) == -1
    finally:
        remote[SIZE : SIZE + 4096] = (np.arange(SIZE, SIZE + 4096) % 251).astype(np.uint8)
        eng.close()


def test_mooncake_calls_keep_their_meaning(pair):
    """transfer_submit_write + transfer_check_status, batch_transfer_async(opcode), transfer_sync(opcode)."""
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 3, 36))
    eng = wrap(pair, daemon.name)
    local, remote = pair["local"], pair["remote"]
    saved = remote[SIZE : SIZE + 8192].copy()
    try:
        local[:8192] = 9
        h = eng.transfer_submit_write(pair["target"], local.ctypes.data, remote.ctypes.data + SIZE, 4096, request=6)
        while (status := eng.transfer_check_status(h)) == 0:
            time.sleep(0.001)
        assert status == 1 and (remote[SIZE : SIZE + 4096] == 9).all()
        op = mooncake_engine.TransferOpcode
        h = eng.batch_transfer_async(pair["target"], [local.ctypes.data], [remote.ctypes.data + SIZE + 4096], [4096],
                                     op.Write, request=6, stage=Stage.P2D, layer=4)
        assert eng.get_batch_transfer_status([h]) == 0 and (remote[SIZE + 4096 : SIZE + 8192] == 9).all()
        local[:4096] = 0
        assert eng.transfer_sync(pair["target"], local.ctypes.data, remote.ctypes.data, 4096, op.Read, request=6) == 0
        assert np.array_equal(local[:4096], remote[:4096])
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == 3)
        assert [e["stage"] for e in daemon.of_kind(EventKind.SUBMIT)] == [Stage.P2D, Stage.P2D, Stage.REUSE]
    finally:
        remote[SIZE : SIZE + 8192] = saved
        eng.close()
        daemon.close()


def test_gated_lower_level_waits_while_higher_level_runs(pair):
    """Request 2 (level 5) waits until request 1 (level 1) has completed, then runs."""
    order: list[tuple[str, int]] = []
    high_done = threading.Event()

    def decide(ev):
        if ev["request_id"] == 1:
            return (Gate.OPEN, 1, 38)
        return None  # request 2 waits for the test

    daemon = SegmentDaemon(decide)
    eng = wrap(pair, daemon.name)
    local, remote = pair["local"], pair["remote"]
    local[:] = 0
    try:
        low = eng.submit("read", pair["target"], [local.ctypes.data + SIZE], [remote.ctypes.data + SIZE], [SIZE],
                         request=2, stage=Stage.REUSE, layer=3)
        daemon.wait_for(lambda evs: any(e["request_id"] == 2 and e["kind"] == EventKind.SUBMIT for e in evs))
        high = eng.submit("read", pair["target"], [local.ctypes.data], [remote.ctypes.data], [SIZE],
                          request=1, stage=Stage.COLLECTIVE, layer=3)
        high.add_done_callback(lambda f: (order.append(("high", f.result())), high_done.set()))
        assert high.result(timeout=20) == 0
        assert high_done.wait(5)
        time.sleep(0.05)
        assert not low.done(), "the gated transfer ran without its permit"
        assert np.count_nonzero(local[SIZE:]) == 0
        low_submit = next(e for e in daemon.of_kind(EventKind.SUBMIT) if e["request_id"] == 2)
        daemon.open(low_submit["msg_id"], level=5, dscp=34)
        assert low.result(timeout=20) == 0
        order.append(("low", 0))
        assert order == [("high", 0), ("low", 0)]
        assert np.array_equal(local, remote)
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == 2)
        done = {e["request_id"]: e for e in daemon.of_kind(EventKind.COMPLETION)}
        assert done[1]["bytes"] == SIZE and done[1]["stage"] == Stage.COLLECTIVE and done[1]["layer"] == 3
        assert done[2]["msg_id"] == low_submit["msg_id"] and done[2]["stage"] == Stage.REUSE
        assert eng.gate.stats["released"] == 2 and eng.gate.stats["failopen"] == 0
    finally:
        eng.close()
        daemon.close()


def test_stale_heartbeat_releases_waiting_transfer(pair):
    daemon = SegmentDaemon(lambda ev: None)  # never grants
    eng = wrap(pair, daemon.name)
    local, remote = pair["local"], pair["remote"]
    local[:] = 0
    try:
        fut = eng.submit("read", pair["target"], [local.ctypes.data], [remote.ctypes.data], [4096], request=9)
        daemon.wait_for(lambda evs: any(e["kind"] == EventKind.SUBMIT for e in evs))
        time.sleep(0.05)
        assert not fut.done()
        daemon.hang()  # the daemon hangs: its heartbeat goes stale after 200 ms
        assert fut.result(timeout=10) == 0
        assert np.array_equal(local[:4096], remote[:4096])
        assert eng.gate.stats["failopen"] == 1
    finally:
        eng.close()
        daemon.close()


def test_restarted_daemon_is_attached_again(pair):
    first = SegmentDaemon(lambda ev: (Gate.OPEN, 3, 36))
    eng = wrap(pair, first.name)
    local, remote = pair["local"], pair["remote"]
    second = None
    try:
        assert eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data, 4096, request=1) == 0
        first.close()  # the daemon exits and removes its segment
        second = SegmentDaemon(lambda ev: (Gate.OPEN, 3, 36), name=first.name)
        # announced to the old mapping until its heartbeat is stale (200 ms), then failed open
        assert eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data, 4096, request=2) == 0
        assert eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data, 4096, request=3) == 0
        second.wait_for(lambda evs: any(e["request_id"] == 3 and e["kind"] == EventKind.COMPLETION for e in evs))
        stats = eng.gate.stats  # request 2 failed open, or was gated by the new daemon on a slow machine
        assert stats["released"] + stats["failopen"] == 3 and stats["released"] >= 2 and stats["bypassed"] == 0
    finally:
        eng.close()
        if second is not None:
            second.close()


scapy_all = pytest.importorskip("scapy.all")
from wire_capture import WireCapture  # noqa: E402  (lossless: scapy's sniffer drops most of a burst on lo)


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
def test_permit_dscp_on_the_wire_and_socket_tags(pair):
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 2, 37))
    eng = wrap(pair, daemon.name)
    local, remote = pair["local"], pair["remote"]
    try:
        assert eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data, 4096, request=3) == 0
        socks = eng._peers[pair["target"]].sockets
        assert socks, "Mooncake's data connection to the peer was not found"
        ports = {s.local[1] for s in socks} | {s.remote[1] for s in socks}
        capture = WireCapture("lo")
        local[:] = 0
        assert eng.transfer_sync_read(pair["target"], local.ctypes.data, remote.ctypes.data, SIZE, request=4, layer=2) == 0
        time.sleep(0.3)
        captured = capture.stop()
        assert capture.drops == 0
        assert np.array_equal(local[:SIZE], remote[:SIZE])
        packets = [p for p in captured if p.sport in ports and p.dport in ports and p.payload > 0]
        assert sum(p.payload for p in packets) >= SIZE, "the data packets were not captured"
        per_flow: dict = {}
        for p in packets:
            per_flow.setdefault((p.sport, p.dport), set()).add(p.dscp)
        dscps = {p.dscp for p in packets}
        assert dscps == {37}, f"DSCP seen: {dscps}, per flow {per_flow}, known {socks}"
        # both directions: the request and the data the peer's socket sends back
        assert len(per_flow) == 2
        tag = daemon.seg.read_tag(os.getpid(), TagKind.SOCKET, socks[0].fd)
        assert tag is not None and tag.dscp == 37 and tag.request_id == 4 and tag.layer == 2
    finally:
        eng.close()
        daemon.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
def test_write_to_a_peer_process_carries_the_permit_dscp(pair):
    """The target engine runs in another process: our socket sends the written bytes.

    The first write to the new peer is primed (its first PRIME_BYTES open the
    connection unmarked), so all but those bytes carry the permit's class.
    """
    peer = subprocess.Popen([sys.executable, str(Path(__file__).with_name("mooncake_target.py")), str(SIZE)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 4, 35))
    eng = wrap(pair, daemon.name)
    local = pair["local"]
    capture = None
    try:
        info = json.loads(peer.stdout.readline())
        target = f"127.0.0.1:{info['port']}"
        capture = WireCapture("lo")
        local[:SIZE] = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8)
        assert eng.transfer_sync_write(target, local.ctypes.data, info["addr"], SIZE, request=5, layer=1) == 0
        h = eng.batch_transfer_async_write(target, [local.ctypes.data], [info["addr"]], [SIZE], request=5, layer=2)
        assert eng.get_batch_transfer_status([h]) == 0
        time.sleep(0.3)
        captured = capture.stop()
        assert capture.drops == 0
        peer.stdin.write(f"0 {SIZE}\n")
        peer.stdin.flush()
        assert peer.stdout.readline().strip() == hashlib.sha256(local[:SIZE].tobytes()).hexdigest()
        socks = eng._peers[target].sockets
        assert socks and all(s.remote[0] == "127.0.0.1" for s in socks)
        mine = {s.local[1] for s in socks}
        packets = [p for p in captured if p.sport in mine and p.payload > 0]
        flows: dict = {}
        for p in captured:
            flows[(p.sport, p.dport, p.dscp)] = flows.get((p.sport, p.dport, p.dscp), 0) + p.payload
        marked = sum(p.payload for p in packets if p.dscp == 35)
        assert marked >= 2 * SIZE - PRIME_BYTES, (flows, socks)
        unmarked = sum(p.payload for p in packets if p.dscp != 35)
        assert unmarked <= PRIME_BYTES + 64, f"{unmarked} bytes left unmarked (primer: {PRIME_BYTES}) {flows}"
        stages = {e["stage"] for e in daemon.of_kind(EventKind.SUBMIT)}
        assert stages == {Stage.P2D}  # writes default to stage 3
    finally:
        if capture is not None and capture.sock.fileno() >= 0:
            capture.stop()
        eng.close()
        daemon.close()
        peer.stdin.close()
        peer.wait(timeout=30)


def test_mc_ib_tc_keeps_mooncake_class_on_rdma_only():
    cfg = MooncakeAdapterConfig.from_env({"MC_IB_TC": "104", "MC_IB_SL": "3"})
    assert (cfg.ib_tc, cfg.ib_sl) == (104, 3)
    assert cfg.wire_dscp("rdma", 38) == -1
    assert cfg.wire_dscp("tcp", 38) == 38
    assert cfg.wire_dscp("tcp", None) == -1
    plain = MooncakeAdapterConfig.from_env({"MC_IB_TC": "-1"})
    assert plain.ib_tc is None and plain.wire_dscp("rdma", 38) == 38
    with pytest.raises(UserError, match="MC_IB_TC: expected an integer"):
        MooncakeAdapterConfig.from_env({"MC_IB_TC": "high"})
    with pytest.raises(UserError, match="MC_IB_SL: expected an integer 0..15"):
        MooncakeAdapterConfig.from_env({"MC_IB_SL": "16"})


def test_tent_priority_follows_levels():
    assert [tent_priority(lv, 8) for lv in range(9)] == [0, 0, 1, 1, 1, 1, 1, 2, 2]


def test_bad_arguments_are_refused(pair):
    eng = wrap(pair, missing_name())
    try:
        with pytest.raises(ValueError, match="op: expected"):
            eng.submit("copy", pair["target"], [1], [1], [1])
        with pytest.raises(ValueError, match="equal, non-zero lengths"):
            eng.submit("read", pair["target"], [1, 2], [1], [1])
        with pytest.raises(ValueError, match="unknown handle"):
            eng.get_batch_transfer_status([12345])
    finally:
        eng.close()


def test_bad_wait_bounds_are_refused():
    for bad in (-1.0, float("inf"), "1"):
        with pytest.raises(UserError, match="drain_timeout_s"):
            MooncakeAdapterConfig(drain_timeout_s=bad)
        with pytest.raises(UserError, match="raise_wait_s"):
            MooncakeAdapterConfig(raise_wait_s=bad)


def test_records_keep_each_transfer_permit_and_times(pair):
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 3, 36))
    eng = wrap(pair, daemon.name)
    local, remote = pair["local"], pair["remote"]
    try:
        assert eng.transfer_sync_write(pair["target"], local.ctypes.data, remote.ctypes.data, 1 << 20,
                                       request=9, stage=Stage.P2D, layer=4) == 0
        rec = eng.records[-1]
        assert (rec.op, rec.request, rec.stage, rec.layer, rec.nbytes) == ("write", 9, Stage.P2D, 4, 1 << 20)
        assert (rec.level, rec.dscp, rec.status) == (3, 36, 0) and rec.msg_id > 0
        assert rec.drained and rec.done >= rec.moved >= rec.permitted
        submits = [e for e in daemon.of_kind(EventKind.SUBMIT) if e["request_id"] == 9]
        assert rec.msg_id in {e["msg_id"] for e in submits}
    finally:
        eng.close()
        daemon.close()


GLOG_PROBE = (
    "from laxflow.adapters.mooncake import TransferEngine\n"
    "e = TransferEngine()\n"
    "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0\n"
)


@pytest.mark.parametrize("level,quiet", [("3", True), ("0", False)])
def test_wrapper_applies_glog_minloglevel_to_mooncake(level, quiet):
    """The wheel's glog (built with gflags) reads no GLOG_* variable; the
    wrapper gives it the user's GLOG_minloglevel: at 3 Mooncake's start-up
    INFO/WARNING lines are gone, at 0 they are there."""
    env = dict(os.environ, GLOG_minloglevel=level)
    proc = subprocess.run([sys.executable, "-c", GLOG_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    glog_lines = [line for line in proc.stderr.splitlines() if line[:1] in "IWE" and "transfer_engine" in line]
    assert (not glog_lines) if quiet else glog_lines, proc.stderr[-2000:]


def test_bad_glog_minloglevel_is_one_clear_error():
    from laxflow.adapters.mooncake_config import apply_glog_level

    with pytest.raises(UserError, match="GLOG_minloglevel: expected 0"):
        apply_glog_level({"GLOG_minloglevel": "loud"})
    assert apply_glog_level({}) is None
