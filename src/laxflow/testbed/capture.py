"""DSCP on the wire: per-flow histograms (TCP, RoCEv2) and RoCEv2 probes.

``laxflow testbed verify-dscp`` calls :func:`verify_dscp` in the namespace of
the interface (the CLI re-runs itself under ``ip netns exec`` for
``--netns``, so scapy sees that namespace's interfaces and routes);
``laxflow testbed probe`` calls :func:`probe`. Both run in the main thread of
a root process. scapy is imported here only, so ``laxflow --help`` stays fast.

Counting note: on veth and most NICs the kernel hands a capture socket
GSO/GRO super-packets, so "packets" counts what the capture saw, not wire
frames; DSCP is the same on every segment of one.
"""

from __future__ import annotations

import ctypes
import select
import socket
import struct
import time
from collections import Counter, defaultdict
from typing import Any, Callable

ROCEV2_PORT = 4791
ETH_P_ALL = 0x0003
SNAP = 256  # bytes kept per packet: Ethernet + IP + TCP/UDP + BTH headers fit
RC_SEND_ONLY = 0x04  # BTH opcode: RC SEND Only (IBTA vol. 1, table 38)


def _flow_record() -> dict[str, Any]:
    return {"dscp": Counter(), "packets": 0, "bytes": 0, "opcodes": Counter(), "dest_qp": set(), "psn": []}


SOL_PACKET, PACKET_STATISTICS = 263, 6
SO_RCVBUFFORCE, SO_ATTACH_FILTER = 33, 26


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_SNAP_PROGRAM = (_SockFilter * 1)(_SockFilter(0x06, 0, 0, SNAP))  # BPF_RET|BPF_K SNAP: keep SNAP bytes


def _open(iface: str) -> socket.socket:
    """A packet socket on ``iface`` that queues only headers.

    Without the snap filter every queued packet costs its full size (GSO
    packets are 64 KB), and a default-sized buffer drops most of a burst
    while scapy imports; drops that remain are reported, not hidden.
    """
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    prog = _SockFprog(1, _SNAP_PROGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(memoryview(prog).cast("B")))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.bind((iface, ETH_P_ALL))  # protocol 0 here would receive nothing
    sock.setblocking(False)
    return sock


def _drops(sock: socket.socket) -> int:
    _packets, drops = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    return drops


def verify_dscp(ifaces: str | list[str], seconds: float, egress_only: bool = False,
                on_ready: Callable[[], None] | None = None) -> dict[str, Any]:
    """Capture on ``ifaces`` for ``seconds``; return DSCP per flow and in total.

    A flow is (protocol, src, sport, dst, dport); RoCEv2 flows (UDP 4791)
    also report BTH opcodes, destination QPs and the PSN range seen.
    ``egress_only`` keeps only packets the interface sends (on a switch,
    capturing every port this way counts each packet once, at its egress).
    Raw AF_PACKET sockets, first ``SNAP`` bytes of each packet; scapy parses.
    ``on_ready`` is called once the sockets are open (packets from then on count).
    """
    names = [ifaces] if isinstance(ifaces, str) else list(ifaces)
    # Sockets first: packets queue in them while scapy's (slow) import runs.
    socks = [_open(name) for name in names]
    started = time.time()
    deadline = time.monotonic() + seconds
    if on_ready is not None:
        on_ready()
    from scapy.all import IP, TCP, UDP, Ether  # noqa: PLC0415 (heavy import)
    from scapy.contrib.roce import BTH  # noqa: PLC0415

    flows: dict[tuple[str, str, int, str, int], dict[str, Any]] = defaultdict(_flow_record)
    total: Counter[int] = Counter()
    other = 0

    def tally(pkt: Any) -> None:
        nonlocal other
        if IP not in pkt:
            other += 1
            return
        ip = pkt[IP]
        dscp = ip.tos >> 2
        if TCP in pkt:
            key = ("tcp", ip.src, pkt[TCP].sport, ip.dst, pkt[TCP].dport)
        elif UDP in pkt and pkt[UDP].dport == ROCEV2_PORT:
            key = ("rocev2", ip.src, pkt[UDP].sport, ip.dst, pkt[UDP].dport)
        elif UDP in pkt:
            key = ("udp", ip.src, pkt[UDP].sport, ip.dst, pkt[UDP].dport)
        else:
            key = (f"ip{ip.proto}", ip.src, 0, ip.dst, 0)
        rec = flows[key]
        rec["dscp"][dscp] += 1
        rec["packets"] += 1
        rec["bytes"] += ip.len
        total[dscp] += 1
        if key[0] == "rocev2" and BTH in pkt:
            bth = pkt[BTH]
            rec["opcodes"][int(bth.opcode)] += 1
            rec["dest_qp"].add(int(bth.dqpn))
            rec["psn"].append(int(bth.psn))

    def drain(sock: socket.socket, until: float = float("inf")) -> None:
        while time.monotonic() < until:
            try:
                data, addr = sock.recvfrom(SNAP)
            except BlockingIOError:
                return
            if egress_only and addr[2] != socket.PACKET_OUTGOING:
                continue
            tally(Ether(data))

    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(socks, [], [], min(left, 0.2))
            for sock in ready:
                drain(sock)
        for sock in socks:  # what queued up while scapy was importing or we were parsing
            drain(sock, until=time.monotonic() + 2.0)
        drops = sum(_drops(sock) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    out_flows = []
    for (proto, src, sport, dst, dport), rec in sorted(flows.items(), key=lambda kv: -kv[1]["packets"]):
        flow: dict[str, Any] = {"proto": proto, "src": src, "sport": sport, "dst": dst, "dport": dport,
                                "packets": rec["packets"], "bytes": rec["bytes"],
                                "dscp": {str(k): v for k, v in sorted(rec["dscp"].items())}}
        if proto == "rocev2":
            flow["opcodes"] = {f"{k:#04x}": v for k, v in sorted(rec["opcodes"].items())}
            flow["dest_qp"] = sorted(rec["dest_qp"])
            flow["psn"] = [min(rec["psn"]), max(rec["psn"])] if rec["psn"] else []
        out_flows.append(flow)
    return {"iface": ",".join(names), "seconds": round(time.time() - started, 3), "flows": out_flows,
            "dscp": {str(k): v for k, v in sorted(total.items())}, "non_ip_packets": other,
            "capture_drops": drops}


def rocev2_payload(src: str, sport: int, dst: str, dscp: int, dest_qp: int, psn: int, size: int) -> bytes:
    """UDP payload of one RoCEv2 RC SEND-Only packet: BTH, ``size`` bytes, ICRC.

    The ICRC covers the IP and UDP headers (with TOS, TTL and checksums
    masked), so it is computed over the packet as the kernel will send it.
    """
    from scapy.all import IP, UDP, Raw, raw  # noqa: PLC0415
    from scapy.contrib.roce import BTH  # noqa: PLC0415

    pkt = (IP(src=src, dst=dst, tos=dscp << 2) / UDP(sport=sport, dport=ROCEV2_PORT)
           / BTH(opcode=RC_SEND_ONLY, dqpn=dest_qp, psn=psn, ackreq=1) / Raw(bytes(size)))
    return raw(pkt)[28:]  # after the 20-byte IP and 8-byte UDP headers


def probe(dst: str, dscp: int, count: int = 10, dest_qp: int = 0x11, size: int = 64, interval: float = 0.001) -> dict[str, Any]:
    """Send ``count`` RoCEv2 packets with DSCP ``dscp`` to ``dst`` (UDP 4791).

    A kernel UDP socket carries them (its IP_TOS sets the DSCP), so routing
    and ARP are the host's own; PSNs count up from 0. Nothing needs to listen
    at ``dst``: the point is which switch queue they land in.
    """
    if not 0 <= dscp <= 63:
        raise ValueError(f"--dscp: expected 0..63, got {dscp}")
    if not 1 <= count <= 1_000_000:
        raise ValueError(f"--count: expected 1..1000000, got {count}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
        route.connect((dst, ROCEV2_PORT))  # no packet: only asks the kernel for the source address
        src = route.getsockname()[0]
    # Unconnected, so an ICMP port-unreachable from dst never fails a later send.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        sock.bind((src, 0))
        sport = sock.getsockname()[1]
        sent = 0
        for psn in range(count):
            sent += sock.sendto(rocev2_payload(src, sport, dst, dscp, dest_qp, psn, size), (dst, ROCEV2_PORT)) > 0
            if interval:
                time.sleep(interval)
    finally:
        sock.close()
    return {"dst": dst, "dscp": dscp, "sent": sent, "src": src, "sport": sport, "dest_qp": dest_qp}
