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
        self._pinned: dict[int, int] | None = None  # pinned connections still open: inode -> fd
        self._dscp_set: dict[int, int] = {}  # inode -> the DSCP last written to its IP_TOS

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
        self._pinned = None
        return len(self._own)

    @property
    def gate(self) -> PermitGate:
        return self._gate

    @contextmanager
    def collective(self, request: int, layer: int, nbytes: int) -> Iterator[Permit | None]:
        """Wait for the permit, mark Gloo's sockets, run the body, report completion.

        The calling thread waits for the permit itself (``PermitGate.acquire``):
        the collective blocks it anyway, and no thread hand-off sits between
        the permit and the all_to_all. COMPLETION carries ``nbytes`` also when
        the body raised (the bytes may have moved; the daemon must not wait
        for them).
        """
        ticket = self._gate.acquire(request, Stage.COLLECTIVE, layer, nbytes)
        permit = ticket.permit
        if permit is not None:
            self._mark(permit, request, layer, nbytes)
        try:
            yield permit
        finally:
            self._gate.release(ticket)

    def _mark(self, permit: Permit, request: int, layer: int, nbytes: int) -> None:
        tag = TagValue(permit.msg_id, request, nbytes, Stage.COLLECTIVE, layer, permit.dscp)
        if self._own is not None:
            # Pinned: Gloo's connections are known; no scan of the descriptor table per collective.
            if self._pinned is None:
                self._pinned = {s.inode: s.fd for s in tcp_sockets() if s.inode in self._own}
            targets = list(self._pinned.items())
        else:
            targets = [(s.inode, s.fd) for s in tcp_sockets()
                       if s.state == "ESTABLISHED" and s.inode not in self._before]
        for inode, fd in targets:
            if self._dscp_set.get(inode) != permit.dscp:  # IP_TOS sticks: set it only when the class moves
                if not set_dscp(fd, inode, permit.dscp):
                    self._dscp_set.pop(inode, None)
                    if self._pinned is not None:
                        self._pinned.pop(inode, None)  # closed (or its fd reused): Gloo's no more
                    continue
                self._dscp_set[inode] = permit.dscp
            self._gate.write_tag(TagKind.SOCKET, fd, tag)

    def close(self) -> None:
        self._gate.close()
