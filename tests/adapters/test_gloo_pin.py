"""GlooCollectives marks only Gloo's connections once they are pinned, not
connections the process opens later (a Mooncake engine's pooled ones)."""

from __future__ import annotations

import socket

from laxflow.adapters.gate import GateConfig
from laxflow.adapters.gloo import GlooCollectives
from laxflow.protocol.shm import Gate, Permit


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    c = socket.create_connection(listener.getsockname())
    s, _ = listener.accept()
    return c, s


def _dscp(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) >> 2


def test_pinned_connections_are_marked_and_later_ones_are_left_alone(tmp_path):
    old_ls = socket.create_server(("127.0.0.1", 0))
    old = _pair(old_ls)  # the process's connections before Gloo
    coll = GlooCollectives(GateConfig(shm_name=f"/lxf-pin-absent-{id(tmp_path)}"))  # no daemon: fails open
    try:
        ls = socket.create_server(("127.0.0.1", 0))
        gloo = _pair(ls)  # "Gloo's full mesh"
        assert coll.pin_sockets(peers=["127.0.0.1"]) == 2
        later = _pair(ls)  # e.g. Mooncake's, opened after the process group
        coll._mark(Permit(5, Gate.OPEN, 0, 38), request=1, layer=0, nbytes=100)
        assert [_dscp(s) for s in gloo] == [38, 38]
        assert [_dscp(s) for s in later] == [0, 0]
        assert [_dscp(s) for s in old] == [0, 0]
    finally:
        coll.close()


def test_peers_filter_pins_only_connections_to_those_addresses(tmp_path):
    coll = GlooCollectives(GateConfig(shm_name=f"/lxf-pin-absent2-{id(tmp_path)}"))
    try:
        ls = socket.create_server(("127.0.0.1", 0))
        _keep = _pair(ls)
        assert coll.pin_sockets(peers=["10.255.255.1"]) == 0
    finally:
        coll.close()
