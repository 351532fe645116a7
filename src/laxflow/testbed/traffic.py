"""Bulk TCP streams with a DSCP, for checking the fabric's priority queues.

iperf3 is not needed: ``python -m laxflow.testbed.traffic sink --ports 5001,5002
--seconds 4`` counts the bytes each port receives and prints JSON;
``... send --dst 10.77.0.3 --port 5001 --dscp 39 --seconds 4 [--at T]`` sends as fast
as TCP lets it with ``IP_TOS = dscp << 2`` set before ``connect`` (so the SYN
and every segment carry it), from the instant ``T`` (``time.time()``) when given. Each runs inside a testbed namespace
(``Testbed.popen_in``); the tests start one sink and several senders.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

CHUNK = 256 * 1024


def sink(ports: list[int], seconds: float, bind: str = "0.0.0.0") -> dict[str, int]:
    """Accept on every port for ``seconds``; return bytes received per port."""
    totals = {port: 0 for port in ports}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def serve(port: int, listener: socket.socket) -> None:
        listener.settimeout(0.2)
        conns: list[socket.socket] = []
        while time.monotonic() < deadline:
            try:
                conn, _ = listener.accept()
                conn.settimeout(0.2)
                conns.append(conn)
            except socket.timeout:
                pass
            for conn in list(conns):
                try:
                    while time.monotonic() < deadline:
                        data = conn.recv(CHUNK)
                        if not data:
                            conns.remove(conn)
                            break
                        with lock:
                            totals[port] += len(data)
                except socket.timeout:
                    continue
        for conn in conns:
            conn.close()

    threads = []
    for port in ports:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(8)
        thread = threading.Thread(target=serve, args=(port, listener), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return {str(port): n for port, n in totals.items()}


def send(dst: str, port: int, dscp: int, seconds: float, connect_timeout: float = 5.0, at: float | None = None) -> int:
    """Send zeros to ``dst:port`` for ``seconds`` with DSCP ``dscp``; return bytes sent.

    ``at`` (a ``time.time()`` instant): connect first, then start sending
    then, so senders started one after the other (a Python process each,
    slow to start on a loaded machine) send over the same window and
    neither has the link to itself for a while."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    start = time.monotonic()
    while True:  # the sink may still be binding
        try:
            sock.connect((dst, port))
            break
        except (ConnectionRefusedError, OSError):
            if time.monotonic() - start > connect_timeout:
                raise
            time.sleep(0.05)
            sock.close()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    sock.settimeout(0.5)
    payload = bytes(CHUNK)
    sent = 0
    if at is not None:
        time.sleep(max(0.0, at - time.time()))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sent += sock.send(payload)
        except socket.timeout:
            continue
        except OSError:
            break
    sock.close()
    return sent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m laxflow.testbed.traffic")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("sink")
    s.add_argument("--ports", required=True)
    s.add_argument("--seconds", type=float, required=True)
    t = sub.add_parser("send")
    t.add_argument("--dst", required=True)
    t.add_argument("--port", type=int, required=True)
    t.add_argument("--dscp", type=int, default=0)
    t.add_argument("--seconds", type=float, required=True)
    t.add_argument("--at", type=float, default=None, help="start sending at this time.time() instant (after connecting)")
    args = parser.parse_args(argv)
    if args.role == "sink":
        print(json.dumps(sink([int(p) for p in args.ports.split(",")], args.seconds)), flush=True)
    else:
        if not 0 <= args.dscp <= 63:
            parser.error(f"--dscp: expected 0..63, got {args.dscp}")
        print(json.dumps({"sent": send(args.dst, args.port, args.dscp, args.seconds, at=args.at)}), flush=True)


if __name__ == "__main__":
    main()
