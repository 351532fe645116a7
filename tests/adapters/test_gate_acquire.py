"""PermitGate.acquire/release: a collective's caller waits for its own permit.

Real segment, a test thread acting as the daemon (segment_daemon).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.adapters.gloo import GlooCollectives
from laxflow.protocol.shm import EventKind, Gate, Stage, TagKind

from segment_daemon import SegmentDaemon


@pytest.fixture
def daemon():
    d = SegmentDaemon(decide=lambda ev: None)  # every message waits until the test opens it
    yield d
    d.close()


def test_acquire_blocks_until_the_gate_opens_and_release_reports_completion(daemon):
    gate = PermitGate(GateConfig(shm_name=daemon.name))
    got = []
    try:
        caller = threading.Thread(target=lambda: got.append(gate.acquire(1007, Stage.COLLECTIVE, 2, 300_000)))
        caller.start()
        daemon.wait_for(lambda evs: any(e["kind"] == EventKind.SUBMIT for e in evs))
        submit = daemon.of_kind(EventKind.SUBMIT)[0]
        assert (submit["request_id"], submit["stage"], submit["layer"], submit["bytes"]) == (1007, 2, 2, 300_000)
        caller.join(0.2)
        assert caller.is_alive() and not got  # still waiting: the gate is closed
        daemon.open(submit["msg_id"], level=1, dscp=38)
        caller.join(5)
        assert not caller.is_alive()
        ticket = got[0]
        assert ticket.permit is not None and ticket.permit.dscp == 38 and ticket.msg_id == submit["msg_id"]
        assert daemon.of_kind(EventKind.COMPLETION) == []
        gate.release(ticket)
        daemon.wait_for(lambda evs: any(e["kind"] == EventKind.COMPLETION for e in evs))
        done = daemon.of_kind(EventKind.COMPLETION)[0]
        assert (done["msg_id"], done["bytes"], done["stage"], done["layer"]) == (submit["msg_id"], 300_000, 2, 2)
        assert gate.stats["released"] == 1 and gate.stats["completed"] == 1
    finally:
        gate.close()


def test_acquire_without_a_daemon_fails_open_at_once():
    gate = PermitGate(GateConfig(shm_name=f"/lxf-acq-none-{os.getpid()}"))
    try:
        ticket = gate.acquire(1, Stage.COLLECTIVE, 0, 10)
        assert ticket.permit is None and ticket.msg_id == 0
        gate.release(ticket)  # nothing to report to; must not raise
        assert gate.stats["bypassed"] == 1 and gate.stats["completed"] == 1
    finally:
        gate.close()


def test_acquire_fails_open_when_the_daemon_stops_beating_while_it_waits(daemon):
    gate = PermitGate(GateConfig(shm_name=daemon.name, poll_s=0.01))
    try:
        assert gate.bypass_reason is None  # attached to a live daemon
        daemon.hang()  # the daemon hangs: the held message must not hang the collective
        ticket = gate.acquire(5, Stage.COLLECTIVE, 1, 10)
        assert ticket.permit is None and ticket.msg_id != 0
        assert gate.stats["failopen"] == 1
        gate.release(ticket)
        assert daemon.of_kind(EventKind.COMPLETION) == []  # the old daemon is not told
    finally:
        gate.close()


def _dscp(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) >> 2


def test_collective_marks_pinned_sockets_with_each_permits_class_and_tags_every_collective():
    classes = [38, 38, 36]
    daemon = SegmentDaemon(decide=lambda ev: (Gate.OPEN, 1, classes.pop(0) if classes else 36))
    coll = GlooCollectives(GateConfig(shm_name=daemon.name))
    ls = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    try:
        assert coll.pin_sockets(peers=["127.0.0.1"]) == 2
        seen = []
        for layer, want in enumerate([38, 38, 36]):
            with coll.collective(request=9, layer=layer, nbytes=1000) as permit:
                assert permit is not None and permit.dscp == want
                assert [_dscp(c), _dscp(s)] == [want, want]
                tag = daemon.seg.read_tag(os.getpid(), TagKind.SOCKET, c.fileno())
                assert (tag.msg_id, tag.layer, tag.dscp) == (permit.msg_id, layer, want)
                seen.append(tag.msg_id)
        assert len(set(seen)) == 3  # a fresh message per collective for the shim
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == 3)
        s.close()  # one of the pinned connections goes away: the next collective still runs
        with coll.collective(request=9, layer=3, nbytes=1000) as permit:
            assert permit is None or _dscp(c) == permit.dscp
    finally:
        coll.close()
        daemon.close()
        c.close()
        ls.close()


def test_acquire_after_a_daemon_restart_is_gated_by_the_new_daemon():
    first = SegmentDaemon(decide=lambda ev: (Gate.OPEN, 1, 38))
    gate = PermitGate(GateConfig(shm_name=first.name, reattach_s=0.05, poll_s=0.01))
    second = None
    try:
        ticket = gate.acquire(1, Stage.COLLECTIVE, 0, 10)
        assert ticket.permit is not None and ticket.permit.dscp == 38
        gate.release(ticket)
        first.close()  # the daemon exits and removes its segment; a new one comes up under the same name
        second = SegmentDaemon(decide=lambda ev: (Gate.OPEN, 1, 37), name=first.name)
        deadline = time.monotonic() + 10
        while True:  # announced to the old mapping until its heartbeat is stale: failed open, then re-attached
            ticket = gate.acquire(2, Stage.COLLECTIVE, 0, 10)
            gate.release(ticket)
            if ticket.permit is not None:
                break
            assert time.monotonic() < deadline, gate.stats
        assert ticket.permit.dscp == 37  # the new daemon's permit
        second.wait_for(lambda evs: any(e["kind"] == EventKind.COMPLETION for e in evs))
    finally:
        gate.close()
        if second is not None:
            second.close()


def test_a_permit_that_never_comes_from_a_live_daemon_is_waited_for_at_most_max_wait_s(daemon):
    # A daemon that beats but never opens a message (a policy bug, a message it forgot) held the
    # transfer forever: the serving job hung while every fail-open check (segment, heartbeat) passed.
    gate = PermitGate(GateConfig(shm_name=daemon.name, poll_s=0.01, max_wait_s=0.3))
    try:
        t0 = time.monotonic()
        future = gate.submit(lambda permit: permit, 7, Stage.REUSE, 3, 1000)
        assert future.result(timeout=10) is None  # ran without a permit
        ticket = gate.acquire(8, Stage.COLLECTIVE, 3, 1000)
        assert ticket.permit is None and ticket.msg_id != 0
        gate.release(ticket)
        assert time.monotonic() - t0 >= 0.6  # each waited its bound
        assert gate.stats["wait_timeouts"] == 2 and gate.stats["failopen"] == 2
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == 2)  # the daemon is told
    finally:
        gate.close()


def test_max_wait_s_is_validated_and_read_from_the_environment():
    assert GateConfig().max_wait_s == 10.0
    assert GateConfig.from_env({"LAXFLOW_SHM_NAME": "/x", "LAXFLOW_GATE_MAX_WAIT_S": "2.5"}) == \
        GateConfig(shm_name="/x", max_wait_s=2.5)
    with pytest.raises(ValueError, match="max_wait_s"):
        GateConfig(max_wait_s=0)
    with pytest.raises(ValueError, match="LAXFLOW_GATE_MAX_WAIT_S"):
        GateConfig.from_env({"LAXFLOW_GATE_MAX_WAIT_S": "soon"})
