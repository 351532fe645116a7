"""Header capture on switch ports for test_mooncake_testbed.py (run in the switch namespace).

argv: iface...  Opens the testbed's packet sockets (laxflow.testbed.capture:
headers only, 64 MB buffers, so a burst is not lost), prints "ready", and on
a line (or EOF) on stdin prints, as JSON, the TCP payload bytes per
(src, sport, dst, dport, dscp) that the ports sent, and the kernel's drops.
"""

import json
import socket
import sys

from scapy.all import IP, TCP, Ether

from laxflow.testbed.capture import SNAP, _drops, _open

socks = [_open(name) for name in sys.argv[1:]]
print("ready", flush=True)
sys.stdin.readline()
flows: dict[tuple, int] = {}
drops = 0
for sock in socks:
    sock.setblocking(False)
    while True:
        try:
            data, addr = sock.recvfrom(SNAP)
        except BlockingIOError:
            break
        if addr[2] != socket.PACKET_OUTGOING:  # each switched packet once, where it leaves
            continue
        pkt = Ether(data)
        if IP in pkt and TCP in pkt:
            ip, tcp = pkt[IP], pkt[TCP]
            key = (ip.src, tcp.sport, ip.dst, tcp.dport, ip.tos >> 2)
            flows[key] = flows.get(key, 0) + ip.len - 4 * ip.ihl - 4 * tcp.dataofs
    drops += _drops(sock)
    sock.close()
print(json.dumps({"flows": [[*k, v] for k, v in flows.items()], "drops": drops}), flush=True)
