"""The processes of the contention scenario, one per testbed host.

``python -m laxflow.testbed.worker ROLE CONFIG_JSON`` inside a host namespace
(started by :mod:`laxflow.testbed.scenario`):

- ``kvstore`` (stage-1 source): per connection, reads an 8-byte length and
  streams that many bytes back (the reused KV a prefill host fetches).
- ``decode`` (stage-3 sink): reads ``(request, layer, size)`` headers and
  payloads, acknowledges each message with 8 bytes once fully received.
- ``prefill`` (one per prefill rank): for each request, in arrival order,
  reads the reused KV of all layers from the kvstore (stage 1, layer j must
  be in before layer j computes), computes each layer (a timed sleep), runs
  the layer's all_to_all with the other rank (stage 2: send and receive
  ``a2a_bytes`` at once), and hands layer j's KV to a writer thread that
  sends it to decode (stage 3, overlapping the next layers). TTFT = last
  stage-3 ack - arrival. Prints one JSON line of measurements.

Traffic classes. Each connection is tagged when it is opened, by the tagger
the config names: ``sockopt`` sets ``IP_TOS`` itself; ``shim`` calls the
preloaded laxflow shim's ``laxflow_shim_set_tag(request, stage, layer, dscp)``
before ``connect`` (the per-thread tag adapters use; the process runs under
``LD_PRELOAD``). Accepted connections are tagged too (the prefill
rank's all_to_all receiver by the per-thread tag; the kvstore and decode
servers by the shim's static rule, ``laxflow run --dscp``, or by ``IP_TOS``):
a receiver's ACKs left in DSCP 0 would sit in the lowest strict-priority
queue behind the very traffic its flow is meant to beat. This is the
pluggable seam where the node daemon's permits and the Mooncake/Gloo
adapters will come in.
"""

from __future__ import annotations

import ctypes
import json
import queue
import socket
import struct
import sys
import threading
import time
from typing import Any

HDR = struct.Struct("!QQQ")  # request, layer, size
CHUNK = 256 * 1024


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = sock.recv(min(CHUNK, n - len(buf)))
        if not data:
            raise ConnectionError("peer closed")
        buf += data
    return bytes(buf)


def _drain(sock: socket.socket, n: int) -> None:
    view = bytearray(CHUNK)
    while n > 0:
        got = sock.recv_into(view, min(CHUNK, n))
        if not got:
            raise ConnectionError("peer closed")
        n -= got


class Tagger:
    """Opens connections in a traffic class: by IP_TOS, or by the shim's per-thread tag."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.shim = None
        if kind == "shim":
            self.shim = ctypes.CDLL(None)  # the preloaded liblaxflow_shim.so exports the symbol
            self.shim.laxflow_shim_set_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int]

    def connect(self, addr: tuple[str, int], dscp: int, stage: int, timeout: float = 20.0) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.kind == "sockopt":
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
            elif self.shim is not None:
                self.shim.laxflow_shim_set_tag(0, stage, 0, dscp)
            try:
                sock.connect(addr)
                return sock
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                if self.shim is not None:
                    self.shim.laxflow_shim_clear_tag()


    def accept(self, listener: socket.socket, dscp: int, stage: int) -> socket.socket:
        """Accept in the class of ``stage``: the receiver's ACKs must not fall into a lower queue."""
        if self.shim is not None:
            self.shim.laxflow_shim_set_tag(0, stage, 0, dscp)
        try:
            conn, _ = listener.accept()
        finally:
            if self.shim is not None:
                self.shim.laxflow_shim_clear_tag()
        if self.kind == "sockopt":
            conn.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        return conn


def _listen(port: int) -> socket.socket:
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(16)
    return ls


def kvstore(cfg: dict[str, Any]) -> None:
    ls = _listen(cfg["kv_port"])
    payload = bytes(CHUNK)

    def serve(conn: socket.socket) -> None:
        if cfg["tagger"] == "sockopt":
            conn.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, cfg["dscp"]["1"] << 2)
        try:
            while True:
                (n,) = struct.unpack("!Q", _recv_exact(conn, 8))
                while n > 0:
                    n -= conn.send(payload[: min(n, CHUNK)])
        except (ConnectionError, OSError):
            conn.close()

    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def decode(cfg: dict[str, Any]) -> None:
    ls = _listen(cfg["decode_port"])

    def serve(conn: socket.socket) -> None:
        if cfg["tagger"] == "sockopt":  # with the shim, its static rule tagged the accept
            conn.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, cfg["dscp"]["3"] << 2)
        try:
            while True:
                _req, _layer, size = HDR.unpack(_recv_exact(conn, HDR.size))
                _drain(conn, size)
                conn.sendall(struct.pack("!Q", size))
        except (ConnectionError, OSError):
            conn.close()

    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def prefill(cfg: dict[str, Any]) -> None:
    rank, L = cfg["rank"], cfg["layers"]
    tag = Tagger(cfg["tagger"])
    dscp = {int(k): v for k, v in cfg["dscp"].items()}
    peer_ls = _listen(cfg["a2a_port"] + rank)
    a2a_out = tag.connect((cfg["peer"], cfg["a2a_port"] + 1 - rank), dscp[2], 2)
    a2a_in = tag.accept(peer_ls, dscp[2], 2)
    kv = tag.connect((cfg["kvstore"], cfg["kv_port"]), dscp[1], 1)
    dec = tag.connect((cfg["decode"], cfg["decode_port"]), dscp[3], 3)
    a2a_bytes, reuse, kv_bytes = cfg["a2a_bytes"], cfg["reuse_bytes"], cfg["kv_bytes"]
    payload = bytes(max(a2a_bytes, kv_bytes, 1))
    # Both ranks start together: the scenario gives a wall-clock start a little in the future.
    start = cfg["start_epoch"]
    time.sleep(max(0.0, start - time.time()))
    arrivals = [start + i * cfg["interarrival_s"] for i in range(cfg["requests"])]

    writes: queue.Queue[tuple[int, int] | None] = queue.Queue()
    finished: dict[int, float] = {}

    def writer() -> None:
        while (item := writes.get()) is not None:
            req, layer = item
            dec.sendall(HDR.pack(req, layer, kv_bytes) + payload[:kv_bytes])
            _recv_exact(dec, 8)
            if layer == L - 1:
                finished[req] = time.time()

    wthread = threading.Thread(target=writer, daemon=True)
    wthread.start()
    cct: list[float] = []
    for req, arrival in enumerate(arrivals):
        time.sleep(max(0.0, arrival - time.time()))
        layer_in = [threading.Event() for _ in range(L)]

        def reader(events: list[threading.Event] = layer_in) -> None:
            kv.sendall(struct.pack("!Q", reuse * L))
            for ev in events:
                _drain(kv, reuse)
                ev.set()

        rthread = threading.Thread(target=reader, daemon=True)
        rthread.start()
        for layer in range(L):
            layer_in[layer].wait()
            time.sleep(cfg["compute_s"])
            t0 = time.time()
            sender = threading.Thread(target=a2a_out.sendall, args=(payload[:a2a_bytes],))
            sender.start()
            _drain(a2a_in, a2a_bytes)
            sender.join()
            cct.append(time.time() - t0)
            writes.put((req, layer))
        rthread.join()
    writes.put(None)
    wthread.join()
    ttft = [finished[r] - arrivals[r] for r in range(len(arrivals))]
    print(json.dumps({"rank": rank, "cct": cct, "ttft": ttft}), flush=True)
    for sock in (a2a_out, a2a_in, kv, dec):
        sock.close()


def main() -> None:
    role, cfg = sys.argv[1], json.loads(sys.argv[2])
    {"kvstore": kvstore, "decode": decode, "prefill": prefill}[role](cfg)


if __name__ == "__main__":
    main()
