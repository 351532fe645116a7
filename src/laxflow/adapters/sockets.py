"""Which TCP sockets of this process talk to whom, and marking them.

Libraries such as Mooncake open their data connections on their own threads,
so an adapter cannot wrap ``connect``; it finds the sockets afterwards:
``/proc/self/fd`` lists the socket descriptors, and a duplicate of each
(``getsockname``/``getpeername`` on it) gives its addresses.  That costs
microseconds per socket, where reading ``/proc/net/tcp`` walks the whole
namespace's table (tens of milliseconds on a busy host).  Called by the
Mooncake wrapper's worker threads, only when a peer's connections are not
known yet or have changed.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of this process."""

    fd: int
    inode: int
    local: tuple[str, int]
    remote: tuple[str, int]  # ("", 0) when not connected
    state: str  # ESTABLISHED (has a peer) or LISTEN (no peer: listening or not yet connected)


def socket_inodes() -> dict[int, int]:
    """inode -> fd for every socket descriptor of this process."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            out[int(link[8:-1])] = int(name)
    return out


def _host(addr: tuple) -> tuple[str, int]:
    host = addr[0]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]  # v4-mapped
    return host, int(addr[1])


def tcp_sockets() -> list[TcpSocket]:
    """Every TCP socket (IPv4 and IPv6) this process holds a descriptor of."""
    found: list[TcpSocket] = []
    for inode, fd in socket_inodes().items():
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        try:
            same = os.fstat(dup).st_ino == inode
            sock = socket.socket(fileno=dup) if same else None
        except OSError:
            sock = None
        if sock is None:
            os.close(dup)
            continue
        try:
            with sock:  # closes the duplicate only
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                local = _host(sock.getsockname())
                try:
                    remote, state = _host(sock.getpeername()), "ESTABLISHED"
                except OSError:
                    remote, state = ("", 0), "LISTEN"
        except OSError:
            continue
        found.append(TcpSocket(fd, inode, local, remote, state))
    return found


def set_dscp(fd: int, inode: int, dscp: int) -> bool:
    """Set the DSCP of socket ``fd`` if it still is socket ``inode``.

    Works on a duplicate of the descriptor, so the owner's fd is never
    closed; the inode check keeps a descriptor number reused meanwhile for
    another socket from being marked.  Returns False when the socket is gone.
    """
    if not 0 <= dscp <= 63:
        raise ValueError(f"dscp: expected 0..63, got {dscp}")
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        with socket.socket(fileno=dup) as sock:
            dup = -1  # owned by sock now; closing it closes only the duplicate
            tos = dscp << 2  # ECN bits stay with the kernel
            if sock.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
                try:  # v4-mapped peers use the IPv4 header
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
                except OSError:
                    pass
            else:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        return True
    except OSError:
        return False
    finally:
        if dup >= 0:
            os.close(dup)


def unacked_bytes(fd: int) -> int:
    """Bytes written to TCP socket ``fd`` that its peer has not acknowledged yet (``SIOCOUTQ``); 0 on error."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def wait_drained(fd: int, timeout: float = 0.2, poll: float = 0.0002) -> bool:
    """Wait until every byte written to ``fd`` is acknowledged (at most ``timeout`` s); False on timeout.

    Called before a connection changes traffic class: the class of a TCP
    packet is the socket's when the packet is (re)transmitted, so bytes still
    queued would leave in the new class, and two classes in flight on one
    connection reorder its packets at the switch's priority queues (dup ACKs,
    spurious retransmits, a collapsed window). MFS keeps each message in one
    class for the same reason (§4.3, promotion at message granularity).
    """
    deadline = time.monotonic() + timeout
    while unacked_bytes(fd) > 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True
