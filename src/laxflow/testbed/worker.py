"""The processes of the contention scenario, one per testbed host.

``python -m laxflow.testbed.worker ROLE CONFIG_JSON`` inside a host namespace
(started by :mod:`laxflow.testbed.scenario`):

- ``kvstore`` (stage-1 source): per connection, answers each read request
  ``(request, layer, size, dscp)`` with a ``(request, layer)`` header and
  that many bytes, in the class the request carries (mode ``on``: marked on
  the socket for the shim; reads are one-sided, as Mooncake's RDMA READs:
  the initiator's daemon permits them).
- ``decode`` (stage-3 sink): reads ``(request, layer, size)`` headers and
  payloads, acknowledges each message with ``(request, layer)`` once fully
  received.
- ``prefill`` (one per prefill rank): for each request, in arrival order,
  asks the kvstore for the reused KV of every layer at once (stage 1, layer
  j must be in before layer j computes), computes each layer (a timed
  sleep), runs the layer's all_to_all with the other rank (stage 2: send and
  receive ``a2a_bytes`` at once; a Gloo all_to_all with ``collective:
  gloo``), and submits layer j's KV write to decode as the layer ends (stage
  3, overlapping the next layers; writes are pipelined on the connection, as
  a transfer engine's batch API does, and an acknowledgement thread counts
  them). TTFT = the request's last stage-3 acknowledgement - arrival. The
  first ``warmup`` requests are run and then dropped by the scenario. Prints
  one JSON line of measurements.

Traffic classes. Each connection is tagged when it is opened, by the tagger
the config names: ``sockopt`` sets ``IP_TOS`` itself; ``shim`` calls the
preloaded laxflow shim's ``laxflow_shim_set_tag(request, stage, layer, dscp)``
before ``connect`` (the per-thread tag adapters use; the process runs under
``LD_PRELOAD``). Accepted connections are tagged too (the prefill
rank's all_to_all receiver by the per-thread tag; the kvstore and decode
servers by the shim's static rule, ``laxflow run --dscp``, or by ``IP_TOS``):
a receiver's ACKs left in DSCP 0 would sit in the lowest strict-priority
queue behind the very traffic its flow is meant to beat.

Mode ``on`` (``cfg["daemon"]`` set): every stage's transfer is a message to
the daemon of the host that initiates it (:class:`laxflow.testbed.mfs_io.DaemonIO`):
writes and the all_to_all on the sender's egress port, reads on the
prefill host's receive port (the host that knows the layer progress a
read's RLI counts from). A message is submitted, sent once permitted in the
permit's class (socket flow tag -> shim; a connection changes class only
once its earlier bytes are acknowledged, so no two classes are in flight on
one connection), completed. The prefill ranks register requests (deadline =
arrival + SLO) and batches through the hooks API and report layer progress
on the shared-memory ring. The connection's class at set-up (the stage's
static class) then only carries what no message covers: the receivers' ACKs
(a receiver does not know the sender's permit).
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
KVREQ = struct.Struct("!QQQi")  # request, layer, bytes, DSCP the initiator's permit gave (-1: connection's class)
KVRESP = struct.Struct("!QQ")  # request, layer: before each read's bytes (reads are answered as permitted)
ACK = struct.Struct("!QQ")  # request, layer: the decode host has a write's bytes
CHUNK = 256 * 1024


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = sock.recv(min(CHUNK, n - len(buf)))
        if not data:
            raise ConnectionError("peer closed")
        buf += data
    return bytes(buf)


def recv_discard(sock: socket.socket, n: int) -> None:
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


def listen_on(port: int) -> socket.socket:
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(16)
    return ls


def job_traffic(cfg: dict[str, Any], request: int) -> dict[str, dict[str, float]]:
    """What a rank's engine knows of a request's bytes when it forms the batch, per daemon port.

    Sent: every layer's KV write and all_to_all share on ``eth0``; received:
    every layer's reuse read on the receive port. The coordinator's
    feasibility check (MFS Algorithm 1) orders and prunes requests with it;
    without it the check saw only the messages already submitted.
    """
    from laxflow.testbed.mfs_io import RX_PORT

    layers = cfg["layers"]
    return {"eth0": {str(request): float(layers * (cfg["kv_bytes"] + cfg["a2a_bytes"]))},
            RX_PORT: {str(request): float(layers * cfg["reuse_bytes"])}}


def _daemon_io(cfg: dict[str, Any]):
    """The host daemon's client in mode ``on``, else None (plain sends)."""
    if not cfg.get("daemon"):
        return None
    from laxflow.testbed.mfs_io import DaemonIO

    return DaemonIO(cfg["daemon"]["shm"], cfg["daemon"]["hooks"])


def kvstore(cfg: dict[str, Any]) -> None:
    """Stage-1 responder: serves one layer's reused KV per request, in the class the request names.

    Reads are one-sided, as Mooncake's RDMA READs are: the prefill host that
    needs the bytes asks its own daemon (which sees its layer progress) and
    the permit's class travels in the request; this side only marks and sends.
    """
    ls = listen_on(cfg["kv_port"])
    io = _daemon_io(cfg)

    def serve(conn: socket.socket) -> None:
        if cfg["tagger"] == "sockopt":
            conn.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, cfg["dscp"]["1"] << 2)
        try:
            while True:
                req, layer, n, dscp = KVREQ.unpack(recv_exact(conn, KVREQ.size))
                if io is not None:
                    io.mark(conn, KVRESP.size + n, req, 1, layer, dscp)
                conn.sendall(KVRESP.pack(req, layer) + bytes(n))
        except (ConnectionError, OSError):
            conn.close()

    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def serve_acked(conn: socket.socket) -> None:
    """Receive ``HDR`` + body messages on ``conn`` and acknowledge each with ``ACK``, until the peer goes."""
    try:
        while True:
            req, layer, size = HDR.unpack(recv_exact(conn, HDR.size))
            recv_discard(conn, size)
            conn.sendall(ACK.pack(req, layer))
    except (ConnectionError, OSError):
        conn.close()


def decode(cfg: dict[str, Any]) -> None:
    ls = listen_on(cfg["decode_port"])

    def serve(conn: socket.socket) -> None:
        if cfg["tagger"] == "sockopt":  # with the shim, its static rule tagged the accept
            conn.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, cfg["ack_dscp"] << 2)
        serve_acked(conn)

    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


class GlooAllToAll:
    """Stage 2 as a Gloo all_to_all (torch.distributed, CPU, TCP over eth0).

    ``on``: each collective is gated and marked by
    :class:`laxflow.adapters.gloo.GlooCollectives` (permit -> DSCP on Gloo's
    sockets + flow tags); ``static``: the shim's static rule marks Gloo's
    connections; ``off``: DSCP 0. Made after the rank's other connections,
    so the adapter leaves those alone.
    """

    def __init__(self, cfg: dict[str, Any], rank: int) -> None:
        import torch
        import torch.distributed as dist

        self.dist, self.coll = dist, None
        self.used: dict[str, int] = {}  # "s2:<permit DSCP>" -> collectives
        if cfg.get("daemon"):
            from laxflow.adapters.gate import GateConfig
            from laxflow.adapters.gloo import GlooCollectives

            self.coll = GlooCollectives(GateConfig(shm_name=cfg["daemon"]["shm"]))
        dist.init_process_group("gloo", init_method=f"tcp://{cfg['gloo_master']}", rank=rank, world_size=2)
        self.nbytes = cfg["a2a_bytes"]
        self.send = torch.zeros(2 * self.nbytes, dtype=torch.uint8)  # half of it to the peer
        self.recv = torch.empty_like(self.send)
        self.gate_s: list[float] = []  # per collective: time in the adapter, outside the all_to_all

    def run(self, request: int, layer: int) -> None:
        if self.coll is None:
            self.dist.all_to_all_single(self.recv, self.send)
            return
        t0 = time.perf_counter()
        with self.coll.collective(request=request, layer=layer, nbytes=self.nbytes) as permit:
            t1 = time.perf_counter()
            self.dist.all_to_all_single(self.recv, self.send)
            t2 = time.perf_counter()
        self.gate_s.append(t1 - t0 + time.perf_counter() - t2)
        if permit is not None:
            key = f"s2:{permit.dscp}"
            self.used[key] = self.used.get(key, 0) + 1

    def close(self) -> None:
        self.dist.barrier()
        self.dist.destroy_process_group()
        if self.coll is not None:
            self.coll.close()


def prefill(cfg: dict[str, Any]) -> None:
    rank, L = cfg["rank"], cfg["layers"]
    tag = Tagger(cfg["tagger"])
    dscp = {int(k): v for k, v in cfg["dscp"].items()}
    kv = tag.connect((cfg["kvstore"], cfg["kv_port"]), cfg["ack_dscp"], 1)  # this side: read requests and ACKs
    dec = tag.connect((cfg["decode"], cfg["decode_port"]), dscp[3], 3)
    gloo = cfg.get("collective") == "gloo"
    if gloo:
        a2a = GlooAllToAll(cfg, rank)
        own: list[socket.socket] = []
    else:
        peer_ls = listen_on(cfg["a2a_port"] + rank)
        a2a_out = tag.connect((cfg["peer"], cfg["a2a_port"] + 1 - rank), dscp[2], 2)
        a2a_in = tag.accept(peer_ls, dscp[2], 2)
        own = [a2a_out, a2a_in]
    a2a_bytes, reuse, kv_bytes = cfg["a2a_bytes"], cfg["reuse_bytes"], cfg["kv_bytes"]
    payload = bytes(max(a2a_bytes, kv_bytes, 1))
    io = _daemon_io(cfg)  # before the start: its imports and connections are set-up, not request time
    # Both ranks start together: each says "ready" once set up; the scenario answers with one wall-clock
    # start a little in the future.
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    time.sleep(max(0.0, start - time.time()))
    arrivals = [start + i * cfg["interarrival_s"] for i in range(cfg["requests"])]
    slo_s = cfg["slo_s"]

    def send(sock: socket.socket, data: bytes, req: int, stage: int, layer: int) -> None:
        if io is None:
            sock.sendall(data)
        else:
            io.send(sock, data, req, stage, layer)

    # Stage 3, as a KV transfer engine does it (Mooncake's batch API): each layer's write is submitted
    # when the layer ends and goes when permitted, without waiting for the previous one's
    # acknowledgement; one lock keeps each message whole on the connection, and an acknowledgement
    # thread counts the decode host's per-message acks. TTFT = the request's last KV byte acknowledged.
    writes: queue.Queue[tuple[int, int] | None] = queue.Queue()
    dec_lock = threading.Lock()
    finished: dict[int, float] = {}

    def write(req: int, layer: int) -> None:
        data = HDR.pack(req, layer, kv_bytes) + payload[:kv_bytes]
        if io is None:
            with dec_lock:
                dec.sendall(data)
        else:
            io.submit_send(dec, data, req, 3, layer, lock=dec_lock)

    def writer() -> None:
        while (item := writes.get()) is not None:
            write(*item)

    # per request and layer, seconds after arrival: read in, compute start, all_to_all end, write acknowledged
    # (the simulator model's timeline; one float each)
    timeline = {k: [[0.0] * L for _ in arrivals] for k in ("read", "compute", "a2a", "acked")}

    def acks() -> None:
        count: dict[int, int] = {}
        for _ in range(len(arrivals) * L):
            req, _layer = ACK.unpack(recv_exact(dec, ACK.size))
            timeline["acked"][req - 1000][_layer] = time.time() - arrivals[req - 1000]
            count[req] = count.get(req, 0) + 1
            if count[req] == L:
                finished[req] = time.time()
                if io is not None:
                    io.hooks().request_done(str(req))

    wthread = threading.Thread(target=writer, daemon=True)
    athread = threading.Thread(target=acks, daemon=True)
    wthread.start()
    athread.start()
    kv_lock = threading.Lock()
    cct: list[float] = []
    compute: list[float] = []
    for req, arrival in enumerate(arrivals):
        time.sleep(max(0.0, arrival - time.time()))
        rid = 1000 + req
        layer_in = [threading.Event() for _ in range(L)]
        batch = f"b{rid}-r{rank}"
        if io is not None:
            io.hooks().register_request(str(rid), arrival + slo_s, 1000, reused_tokens=1000)
            io.hooks().batch_formed(batch, [str(rid)], compute_s=L * cfg["compute_s"], traffic=job_traffic(cfg, rid))

        def reader(events: list[threading.Event] = layer_in, rid: int = rid) -> None:
            # Stage 1: every layer's read is asked for at once (a batch read); each is its own message,
            # permitted by this host's daemon (it sees the layer progress) and served in its class.
            def ask(layer: int, dscp: int) -> None:
                with kv_lock:
                    kv.sendall(KVREQ.pack(rid, layer, reuse, dscp))

            arrived = [threading.Event() for _ in events]
            for layer in range(L):
                if io is None:
                    ask(layer, -1)
                else:
                    io.submit_read(reuse, rid, 1, layer, kv.fileno(), lambda d, j=layer: ask(j, d), arrived[layer])
            for _ in range(L):
                _req, layer = KVRESP.unpack(recv_exact(kv, KVRESP.size))
                recv_discard(kv, reuse)
                arrived[layer].set()
                events[layer].set()
                timeline["read"][rid - 1000][layer] = time.time() - arrivals[rid - 1000]

        rthread = threading.Thread(target=reader, daemon=True)
        rthread.start()
        for layer in range(L):
            layer_in[layer].wait()
            if io is not None:  # layer progress through the shared-memory ring: no round trip per layer
                io.gate.layer_boundary(rid, layer)
            timeline["compute"][req][layer] = time.time() - arrival
            slept = time.perf_counter()
            time.sleep(cfg["compute_s"])
            compute.append(time.perf_counter() - slept)  # the sleep's real length (the simulator model's input)
            if io is not None and layer == L - 1:
                io.gate.layer_boundary(rid, None)
            t0 = time.time()
            if gloo:
                a2a.run(rid, layer)
            else:
                sender = threading.Thread(target=send, args=(a2a_out, payload[:a2a_bytes], rid, 2, layer))
                sender.start()
                recv_discard(a2a_in, a2a_bytes)
                sender.join()
            cct.append(time.time() - t0)
            timeline["a2a"][req][layer] = time.time() - arrival
            writes.put((rid, layer))
        rthread.join()
    writes.put(None)
    wthread.join()
    athread.join()
    ttft = [finished[1000 + r] - arrivals[r] for r in range(len(arrivals))]
    used: dict[str, int] = {}
    if io is not None:
        used = {str(k): v for k, v in io.dscp_used.items()}
        if gloo:
            used.update(a2a.used)
        waits = {str(k): sum(v) / len(v) for k, v in io.waits.items()}
    else:
        waits = {}
    gate = {"a2a_gate_s": a2a.gate_s} if gloo else {}
    print(json.dumps({**gate, "rank": rank, "cct": cct, "ttft": ttft, "permit_dscp": used, "permit_wait_s": waits,
                      "compute_s": sum(compute) / len(compute), "compute_all_s": compute,
                      "timeline": timeline}),
          flush=True)
    if io is not None:
        io.close()
    for sock in (*own, kv, dec):
        sock.close()
    if gloo:
        a2a.close()


def main() -> None:
    role, cfg = sys.argv[1], json.loads(sys.argv[2])
    {"kvstore": kvstore, "decode": decode, "prefill": prefill}[role](cfg)


if __name__ == "__main__":
    main()
