"""Which TCP sockets of this process talk to whom, and marking them.

Libraries such as Mooncake open their data connections on their own threads,
so an adapter cannot wrap ``connect``; it finds the sockets afterwards:
``/proc/self/fd`` maps descriptors to socket inodes and ``/proc/self/net/tcp``
(``tcp6``) maps inodes to addresses and state.  Called by the Mooncake
wrapper's worker threads; a few hundred microseconds per scan, done only when
a peer's connections are not known yet or have changed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

_STATES = {"01": "ESTABLISHED", "0A": "LISTEN"}


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of this process (``/proc`` view)."""

    fd: int
    inode: int
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str  # ESTABLISHED, LISTEN or the kernel's hex code


def _addr(hexaddr: str) -> tuple[str, int]:
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four host-order 32-bit words
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        v6 = ipaddress.IPv6Address(words)
        ip = v6.ipv4_mapped or v6
    return str(ip), int(port, 16)


def socket_inodes(pid: int | str = "self") -> dict[int, int]:
    """inode -> fd for every socket descriptor of a process."""
    out: dict[int, int] = {}
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            link = os.readlink(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            out[int(link[8:-1])] = int(name)
    return out


def tcp_sockets(pid: int | str = "self") -> list[TcpSocket]:
    """Every TCP socket (IPv4 and IPv6) the process holds a descriptor of."""
    inodes = socket_inodes(pid)
    found: list[TcpSocket] = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            inode = int(parts[9])
            fd = inodes.get(inode)
            if fd is None or inode == 0:
                continue
            found.append(
                TcpSocket(fd, inode, _addr(parts[1]), _addr(parts[2]), _STATES.get(parts[3], parts[3]))
            )
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
