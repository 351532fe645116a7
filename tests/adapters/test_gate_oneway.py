"""What an engine and a one-sided responder tell the daemon without a round trip.

Real segment, real sockets: layer progress as ring events, the initiator's
class marked on a responder's socket, and the drain a class change waits for.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.adapters.sockets import unacked_bytes, wait_drained
from laxflow.protocol.shm import COMPUTE_DONE_LAYER
from laxflow.protocol.shm import EventKind, TagKind

from segment_daemon import SegmentDaemon


@pytest.fixture
def daemon():
    d = SegmentDaemon()
    yield d
    d.close()


def test_layer_boundaries_are_ring_events_the_core_reads(daemon):
    gate = PermitGate(GateConfig(shm_name=daemon.name))
    try:
        assert gate.layer_boundary(1007, 2)
        assert gate.layer_boundary(1007, None)
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.LAYER_BOUNDARY for e in evs) == 2)
        got = [(e["request_id"], e["layer"]) for e in daemon.of_kind(EventKind.LAYER_BOUNDARY)]
        assert got == [(1007, 2), (1007, COMPUTE_DONE_LAYER)]
        assert daemon.of_kind(EventKind.SUBMIT) == []  # progress is not a message
    finally:
        gate.close()


def test_mark_tags_the_responders_socket_with_a_fresh_message_in_the_given_class(daemon):
    gate = PermitGate(GateConfig(shm_name=daemon.name))
    try:
        assert gate.mark(TagKind.SOCKET, 41, 1007, 1, 3, 200_000, 36)
        first = daemon.seg.read_tag(os.getpid(), TagKind.SOCKET, 41)
        assert (first.request_id, first.stage, first.layer, first.bytes, first.dscp) == (1007, 1, 3, 200_000, 36)
        assert gate.mark(TagKind.SOCKET, 41, 1007, 1, 0, 200_000, 38)
        second = daemon.seg.read_tag(os.getpid(), TagKind.SOCKET, 41)
        assert second.msg_id not in (0, first.msg_id) and second.dscp == 38  # the shim sees a new message
    finally:
        gate.close()


def test_mark_without_a_daemon_fails_open():
    gate = PermitGate(GateConfig(shm_name=f"/lxf-none-{os.getpid()}"))
    try:
        assert not gate.mark(TagKind.SOCKET, 41, 1, 1, 0, 10, 36)
        assert not gate.layer_boundary(1, 0)
    finally:
        gate.close()


def test_wait_drained_waits_until_the_peer_has_acknowledged_every_byte():
    ls = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(ls.getsockname())
    server, _ = ls.accept()
    try:
        client.setblocking(False)
        sent = 0
        try:  # fill the peer's receive window: bytes stay unacknowledged while it does not read
            while True:
                sent += client.send(b"\0" * 65536)
        except BlockingIOError:
            pass
        assert unacked_bytes(client.fileno()) > 0
        assert not wait_drained(client.fileno(), timeout=0.05)

        def read_all() -> None:
            got = 0
            while got < sent:
                got += len(server.recv(1 << 20))

        reader = threading.Thread(target=read_all)
        reader.start()
        assert wait_drained(client.fileno(), timeout=10.0)
        assert unacked_bytes(client.fileno()) == 0
        reader.join()
    finally:
        for s in (client, server, ls):
            s.close()
