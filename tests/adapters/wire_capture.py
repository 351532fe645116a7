"""Every packet header an interface sends, without drops (root only).

scapy's AsyncSniffer parses each packet in Python as it arrives from a
default-sized packet socket; a loopback transfer of a few megabytes (64 KB
GSO packets) overruns it and most packets are lost -- which made a transfer's
packets look absent (the "second transfer keeps the first's DSCP" flake of
test_mooncake_shim.py: its packets were never captured).  This capture uses
the testbed's packet socket (first 256 bytes of each packet, a 64 MB
buffer), lets packets queue while the test runs, and parses them afterwards.
Drops are reported by the kernel and asserted to be zero by the caller.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from laxflow.testbed.capture import SNAP, _drops, _open


@dataclass(frozen=True)
class Packet:
    src: str
    sport: int
    dst: str
    dport: int
    dscp: int
    seq: int
    payload: int  # TCP payload bytes (from the IP header: the capture keeps only the headers)


class WireCapture:
    """Start at construction; :meth:`stop` returns the TCP packets sent on ``iface``."""

    def __init__(self, iface: str = "lo") -> None:
        self.sock = _open(iface)
        self.drops = 0

    def stop(self) -> list[Packet]:
        from scapy.all import IP, TCP, Ether

        out: list[Packet] = []
        try:
            while True:
                try:
                    data, addr = self.sock.recvfrom(SNAP)
                except BlockingIOError:
                    break
                if addr[2] != socket.PACKET_OUTGOING:  # lo shows each packet twice: count it leaving
                    continue
                pkt = Ether(data)
                if IP not in pkt or TCP not in pkt:
                    continue
                ip, tcp = pkt[IP], pkt[TCP]
                out.append(Packet(ip.src, tcp.sport, ip.dst, tcp.dport, ip.tos >> 2, tcp.seq,
                                  ip.len - 4 * ip.ihl - 4 * tcp.dataofs))
            self.drops = _drops(self.sock)
        finally:
            self.sock.close()
        return out


def first_sends(packets: list[Packet]) -> list[tuple[Packet, int]]:
    """Each packet with the payload bytes it sent for the first time on its connection.

    A retransmission (seen on a loaded machine) repeats bytes below the
    highest sequence number sent so far; counting them again would credit a
    class with bytes its transfer never had.  Sequence numbers are unwrapped
    from each connection's first packet.
    """
    high: dict[tuple, int] = {}
    base: dict[tuple, int] = {}
    out = []
    for p in packets:
        conn = (p.src, p.sport, p.dst, p.dport)
        start = (p.seq - base.setdefault(conn, p.seq)) % (1 << 32)
        end = start + p.payload
        out.append((p, max(0, end - max(start, high.get(conn, 0)))))
        high[conn] = max(high.get(conn, 0), end)
    return out
