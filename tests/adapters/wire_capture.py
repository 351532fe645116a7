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
