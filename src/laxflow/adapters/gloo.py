"""Gloo collectives (torch.distributed, CPU, TCP) as stage-2 laxflow messages.

Static mode needs nothing from here: ``laxflow run --dscp N`` makes the shim
mark every connection Gloo opens.  With a node daemon, a rank wraps each
collective in :meth:`GlooCollectives.collective`::

    coll = GlooCollectives()                 # before init_process_group
    dist.init_process_group("gloo", ...)
    with coll.collective(request=batch_id, layer=j, nbytes=send.nbytes):
        dist.all_to_all_single(recv, send)

Entering announces the collective (SUBMIT, stage 2) and blocks until the
daemon's permit (a collective blocks compute anyway; no daemon: at once),
then marks Gloo's connections with the permit's DSCP (``IP_TOS`` on a
duplicate descriptor) and writes socket flow tags for the shim; leaving
reports COMPLETION.  Gloo's connections are the TCP sockets this process
opened after the object was made (Gloo keeps one per peer rank, plus the
rendezvous store's).  Called on the rank's main thread.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterable, Iterator

from laxflow.adapters.gate import GateConfig, PermitGate
from laxflow.adapters.sockets import set_dscp, socket_inodes, tcp_sockets
from laxflow.protocol.shm import Permit, Stage, TagKind, TagValue


class GlooCollectives:
    """Gate and mark one process's Gloo collectives; see the module docstring."""

    def __init__(self, config: GateConfig | None = None) -> None:
        self._gate = PermitGate(config)
        self._before = set(socket_inodes())  # not Gloo's: they existed before it connected
        self._own: set[int] | None = None  # Gloo's connections, once pinned

    def pin_sockets(self, peers: Iterable[str] | None = None) -> int:
        """Take the connections opened since this object was made as Gloo's, and mark only those from now on.

        Call once the process group is up (``init_process_group`` connects
        Gloo's full mesh). Without it every connection newer than this object
        is marked, which is wrong in a process that opens others later (a
        Mooncake engine's pooled connections, one per overlapping transfer).
        ``peers``: only connections to these addresses. Returns how many.
        """
        want = None if peers is None else set(peers)
        self._own = {s.inode for s in tcp_sockets() if s.state == "ESTABLISHED" and s.inode not in self._before
                     and (want is None or s.remote[0] in want)}
        return len(self._own)

    @property
    def gate(self) -> PermitGate:
        return self._gate

    @contextmanager
    def collective(self, request: int, layer: int, nbytes: int) -> Iterator[Permit | None]:
        """Wait for the permit, mark Gloo's sockets, run the body, report completion."""
        granted = threading.Event()
        finished = threading.Event()
        holder: list[Permit | None] = []

        def run(permit: Permit | None) -> None:  # worker thread: holds the message open
            holder.append(permit)
            granted.set()
            finished.wait()

        future = self._gate.submit(run, request, Stage.COLLECTIVE, layer, nbytes)
        granted.wait()
        permit = holder[0]
        if permit is not None:
            self._mark(permit, request, layer, nbytes)
        try:
            yield permit
        finally:
            finished.set()
            future.result()

    def _mark(self, permit: Permit, request: int, layer: int, nbytes: int) -> None:
        tag = TagValue(permit.msg_id, request, nbytes, Stage.COLLECTIVE, layer, permit.dscp)
        for sock in tcp_sockets():
            mine = sock.inode in self._own if self._own is not None else sock.inode not in self._before
            if sock.state == "ESTABLISHED" and mine:
                set_dscp(sock.fd, sock.inode, permit.dscp)
                self._gate.write_tag(TagKind.SOCKET, sock.fd, tag)

    def close(self) -> None:
        self._gate.close()
