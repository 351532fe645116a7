"""Stages 1 and 3 of the contention scenario as Mooncake transfers (``testbed run --transport mooncake``).

Roles (``python -m laxflow.testbed.mooncake_traffic mc_<role> CONFIG_JSON`` in a host
namespace, started by :mod:`laxflow.testbed.scenario`):

- ``mc_kvstore`` (h2, stage-1 source): reusable KV (seeded random bytes)
  served by one plain ``mooncake.engine.TransferEngine`` per traffic class
  (P2PHANDSHAKE, ``tcp``, the namespace's address), all registering the same
  buffer. Each engine's listening sockets carry its class (``IP_TOS``), and
  Linux copies a listener's class into every connection it accepts: a READ's
  bytes, which the *target's* socket sends, leave in the class of the segment
  the initiator read from. That keeps reads one-sided (as an RDMA READ whose
  response takes the responder QP's class): the prefill host's daemon
  permits the read, the wrapper sends it to the segment of the permit's DSCP
  (:meth:`laxflow.adapters.mooncake.TransferEngine.submit` ``segments``), the
  target does nothing per transfer. Prints ``{"segments": {dscp: name},
  "base": address}`` and serves until killed.
- ``mc_decode`` (h3, stage-3 sink): one engine and a buffer with one slot per
  (rank, request, layer). Prints ``{"target", "base"}``; on the line
  ``verify`` it checks every slot against the bytes the rank wrote there and
  prints ``{"verified", "bad"}``.
- ``mc_prefill`` (h0, h1): the prefill loop of :func:`laxflow.testbed.worker.prefill`
  with stage 1 and 3 through :class:`laxflow.adapters.mooncake.TransferEngine`
  (one per rank, under the shim): per request every layer's read is
  submitted at arrival (a future each; the rank's daemon permits it on port
  ``eth0-rx``), layer j waits for its read, checks its bytes, computes, runs
  the all_to_all, and submits its KV write (stage 3, port ``eth0``), which
  completes when decode has acknowledged its bytes. Modes: ``on`` -- permits
  from the host daemon (deadline through ``on_deadline`` -> hooks
  ``register_request``), the permit's DSCP on the initiator's connections
  (``IP_TOS`` + socket flow tag for the shim) and the read's segment;
  ``static`` -- the wrapper's ``static_dscp`` per stage, no daemon; ``off``
  -- the same with DSCP 0 everywhere (one segment).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

from laxflow.adapters.sockets import set_dscp, socket_inodes, tcp_sockets

SLOT_STRIDE = 4099  # write (req, layer)'s bytes start this many bytes further into the rank's source
WARMUP_BYTES = 65536  # per segment, before "ready": Mooncake's connections exist before the measurement
READ_HANDLE = (1 << 32) + (1 << 24)  # message handle of a rank's Mooncake reads, bound to the receive port


def _pattern(seed: str, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _engine(address: str) -> Any:
    from mooncake.engine import TransferEngine

    from laxflow.adapters.mooncake_config import apply_glog_level

    apply_glog_level()  # our GLOG_minloglevel (quiet()), which Mooncake's glog does not read itself
    engine = TransferEngine()
    if engine.initialize(address, "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit(f"mooncake: initialize({address!r}, P2PHANDSHAKE, tcp) failed")
    return engine


def _listeners_to_class(make: Any, dscp: int) -> tuple[Any, list]:
    """``make()`` a Mooncake engine and put its new listening sockets (TcpTransport's data port, the
    handshake port) in class ``dscp``: every connection they accept later inherits it."""
    before = set(socket_inodes())
    engine = make()
    listeners = [s for s in tcp_sockets() if s.inode not in before and s.state == "LISTEN"]
    for s in listeners:
        set_dscp(s.fd, s.inode, dscp)
    return engine, listeners


def kvstore(cfg: dict[str, Any]) -> None:
    size = cfg["layers"] * cfg["reuse_bytes"]
    buf = ctypes.create_string_buffer(_pattern("kv", size), size)
    base = ctypes.addressof(buf)
    engines, segments = [], {}
    for dscp in cfg["segment_dscps"]:
        engine, _ = _listeners_to_class(lambda: _engine(cfg["address"]), dscp)
        if engine.register_memory(base, size) != 0:
            raise SystemExit("mooncake: register_memory failed")
        engines.append(engine)
        segments[str(dscp)] = f"{cfg['address']}:{engine.get_rpc_port()}"
    print(json.dumps({"segments": segments, "base": base}), flush=True)
    sys.stdin.readline()  # the scenario kills us (or closes stdin)


def _slot(cfg: dict[str, Any], rank: int, req: int, layer: int) -> int:
    return ((rank * cfg["requests"] + req) * cfg["layers"] + layer) * cfg["kv_bytes"]


def _src_offset(cfg: dict[str, Any], req: int, layer: int) -> int:
    return ((req * cfg["layers"] + layer) * SLOT_STRIDE) % cfg["kv_bytes"]


def decode(cfg: dict[str, Any]) -> None:
    size = 2 * cfg["requests"] * cfg["layers"] * cfg["kv_bytes"]
    buf = ctypes.create_string_buffer(size)
    base = ctypes.addressof(buf)
    engine = _engine(cfg["address"])
    if engine.register_memory(base, size) != 0:
        raise SystemExit("mooncake: register_memory failed")
    print(json.dumps({"target": f"{cfg['address']}:{engine.get_rpc_port()}", "base": base}), flush=True)
    if sys.stdin.readline().strip() != "verify":
        return
    n = cfg["kv_bytes"]
    view = memoryview(buf).cast("B")
    ok = bad = 0
    for rank in (0, 1):
        src = _pattern(f"src{rank}", 2 * n)
        for req in range(cfg["requests"]):
            for layer in range(cfg["layers"]):
                at, off = _slot(cfg, rank, req, layer), _src_offset(cfg, req, layer)
                if view[at:at + n] == src[off:off + n]:
                    ok += 1
                else:
                    bad += 1
    print(json.dumps({"verified": ok, "bad": bad}), flush=True)
    del engine  # kept registered until the check is done


class _Hooks:
    """One HooksClient per thread (ZeroMQ sockets are not thread-safe)."""

    def __init__(self, address: str) -> None:
        self.address, self.local, self.all, self.lock = address, threading.local(), [], threading.Lock()

    def __call__(self):
        from laxflow.hooks.client import HooksClient

        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = HooksClient(self.address, name="testbed-mooncake")
            with self.lock:
                self.all.append(client)
        return client

    def close(self) -> None:
        for c in self.all:
            c.close()


def prefill(cfg: dict[str, Any]) -> None:
    from laxflow.adapters.gate import GateConfig
    from laxflow.adapters.mooncake import TransferEngine
    from laxflow.adapters.mooncake_config import MooncakeAdapterConfig
    from laxflow.testbed.mfs_io import RX_PORT
    from laxflow.testbed.worker import GlooAllToAll, Tagger, job_traffic, listen_on, recv_discard

    rank, L = cfg["rank"], cfg["layers"]
    reuse, kv_bytes = cfg["reuse_bytes"], cfg["kv_bytes"]
    dscp = {int(k): v for k, v in cfg["dscp"].items()}
    daemon = cfg.get("daemon")
    hooks = _Hooks(daemon["hooks"]) if daemon else None
    # Without a daemon the stages' classes are static (off: DSCP 0, marked as such): the wrapper then
    # knows its connections in every mode, so a write completes when decode has acknowledged its bytes
    # in off too, as in static and on (unmarked, it would complete once its bytes are in the socket).
    static = {1: dscp[1], 3: dscp[3]}
    shm = daemon["shm"] if daemon else f"/{cfg['name']}-mc-no-daemon-{os.getpid()}"

    def on_deadline(request: int, deadline: float) -> None:
        # The wrapper calls this on the first transfer of a request that names its deadline, before
        # that transfer's SUBMIT: the request and its batch are known to the daemon when its reads arrive.
        hooks().register_request(str(request), deadline, 1000, reused_tokens=1000)
        hooks().batch_formed(f"b{request}-r{rank}", [str(request)], compute_s=L * cfg["compute_s"],
                             traffic=job_traffic(cfg, request))

    engine = TransferEngine(config=MooncakeAdapterConfig(gate=GateConfig(shm_name=shm, workers=2 * L + 4),
                                                         static_dscp=static, on_deadline=on_deadline if hooks else None))
    if engine.initialize(cfg["address"], "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("mooncake: initialize failed")
    dst = ctypes.create_string_buffer(L * reuse)
    src = ctypes.create_string_buffer(_pattern(f"src{rank}", 2 * kv_bytes), 2 * kv_bytes)
    for b in (dst, src):
        if engine.register_memory(ctypes.addressof(b), ctypes.sizeof(b)) != 0:
            raise SystemExit("mooncake: register_memory failed")
    expect = _pattern("kv", L * reuse)
    segments = {int(k): v for k, v in cfg["kv_segments"].items()}
    kv_default, kv_base = segments[dscp[1]], cfg["kv_base"]
    dec, dec_base = cfg["decode_target"], cfg["decode_base"]
    if hooks:
        hooks().bind(os.getpid(), READ_HANDLE, RX_PORT)  # reads count on this host's receive port

    # Connections before the measurement (the tcp transport connects before "ready" too): one read per
    # segment and one write, one after the other, so the wrapper learns each segment's connection alone.
    warm = 999_000 + rank
    if hooks:
        hooks().register_request(str(warm), time.time() + 3600, 1)
    for d, target in sorted(segments.items()):
        engine.submit("read", target, [ctypes.addressof(dst)], [kv_base], [WARMUP_BYTES], request=warm, stage=1,
                      handle=READ_HANDLE).result()
    engine.submit("write", dec, [ctypes.addressof(src)], [dec_base + _slot(cfg, rank, 0, 0)], [kv_bytes],
                  request=warm, stage=3).result()
    if hooks:
        hooks().request_done(str(warm))

    gloo = cfg.get("collective") == "gloo"
    if gloo:
        a2a = GlooAllToAll(cfg, rank)
        if a2a.coll is not None:
            # Mooncake opens connections later too (one per overlapping transfer): those are the wrapper's.
            a2a.coll.pin_sockets(peers=[cfg["peer"]])
    else:
        tag = Tagger(cfg["tagger"])
        peer_ls = listen_on(cfg["a2a_port"] + rank)
        a2a_out = tag.connect((cfg["peer"], cfg["a2a_port"] + 1 - rank), dscp[2], 2)
        a2a_in = tag.accept(peer_ls, dscp[2], 2)
    payload = bytes(max(cfg["a2a_bytes"], 1))
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    time.sleep(max(0.0, start - time.time()))
    arrivals = [start + i * cfg["interarrival_s"] for i in range(cfg["requests"])]
    finished: dict[int, float] = {}
    pending: dict[int, int] = {}
    lock = threading.Lock()
    reads_ok = reads_bad = 0
    cct: list[float] = []
    writes = []

    def written(rid: int, fut) -> None:
        with lock:
            pending[rid] -= 1
            last = pending[rid] == 0
            if last:
                finished[rid] = time.time()
        if last and hooks:
            hooks().request_done(str(rid))

    for req, arrival in enumerate(arrivals):
        time.sleep(max(0.0, arrival - time.time()))
        rid = 1000 + req
        deadline = arrival + cfg["slo_s"]
        pending[rid] = L
        ctypes.memset(dst, 0, L * reuse)  # what a read brings in is checked against the store's bytes
        reads = [engine.submit("read", kv_default, [ctypes.addressof(dst) + j * reuse], [kv_base + j * reuse],
                               [reuse], request=rid, stage=1, layer=j, deadline=deadline, handle=READ_HANDLE,
                               segments=segments) for j in range(L)]
        for j in range(L):
            got = ctypes.string_at(ctypes.addressof(dst) + j * reuse, reuse) if reads[j].result() == 0 else b""
            if got == expect[j * reuse:(j + 1) * reuse]:
                reads_ok += 1
            else:
                reads_bad += 1
            if hooks:
                engine.gate.layer_boundary(rid, j)
            time.sleep(cfg["compute_s"])
            if hooks and j == L - 1:
                engine.gate.layer_boundary(rid, None)
            t0 = time.time()
            if gloo:
                a2a.run(rid, j)
            else:
                sender = threading.Thread(target=a2a_out.sendall, args=(payload[:cfg["a2a_bytes"]],))
                sender.start()
                recv_discard(a2a_in, cfg["a2a_bytes"])
                sender.join()
            cct.append(time.time() - t0)
            fut = engine.submit("write", dec, [ctypes.addressof(src) + _src_offset(cfg, req, j)],
                                [dec_base + _slot(cfg, rank, req, j)], [kv_bytes], request=rid, stage=3, layer=j,
                                deadline=deadline)
            fut.add_done_callback(lambda f, rid=rid: written(rid, f))
            writes.append(fut)
    bad_writes = sum(1 for f in writes if f.result() != 0)
    ttft = [finished[1000 + r] - arrivals[r] for r in range(len(arrivals))]
    used: dict[str, int] = {}
    spans: dict[str, list[float]] = {}  # per stage: Mooncake's own time, and (writes) the wait for the acks
    for r in engine.records:
        if r.request < 999_000:
            key = f"s{r.stage}:{r.dscp}"
            used[key] = used.get(key, 0) + 1
            spans.setdefault(f"s{r.stage}_mooncake", []).append(r.moved - r.permitted)
            if r.op == "write":
                spans.setdefault("s3_acked_after", []).append(r.done - r.moved)
    extra: dict[str, Any] = {}
    if gloo:
        used.update(a2a.used)
        extra["a2a_gate_s"] = a2a.gate_s
    print(json.dumps({**extra, "rank": rank, "cct": cct, "ttft": ttft, "permit_dscp": used if daemon else {},
                      "reads_verified": reads_ok, "reads_bad": reads_bad, "writes_failed": bad_writes,
                      "mooncake_stats": dict(engine.stats),
                      "transfer_ms": {k: round(1000 * sum(v) / len(v), 2) for k, v in spans.items()}, "gate_stats": dict(engine.gate.stats)}), flush=True)
    engine.close()
    if hooks:
        hooks.close()
    if gloo:
        a2a.close()


ROLES = {"mc_kvstore": kvstore, "mc_decode": decode, "mc_prefill": prefill}


def quiet(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` (None: ours) with Mooncake's glog at FATAL only: P2P handshake mode logs an ERROR line
    ("Local segment descriptor not found") per engine and peer that is part of its normal start.
    The roles apply it with :func:`~laxflow.adapters.mooncake_config.apply_glog_level` (the wheel's
    glog reads no environment variable)."""
    return dict(os.environ if env is None else env, GLOG_minloglevel="3")


def start_servers(tb: Any, cfg: Any, mode: str, dscp: dict[int, int], env: Any) -> tuple[list, dict]:
    """Start the KV store (h2) and decode (h3) targets; their processes and what the ranks' configs need.

    Called by :func:`laxflow.testbed.scenario._run_job` in the scenario's main thread.
    """
    from laxflow.errors import UserError
    from laxflow.policy.dscp import default_dscp_map

    py = sys.executable
    dscps = {0} if mode == "off" else {dscp[1]}
    if mode == "on":  # a permit may carry any level's class
        dm = default_dscp_map(8)
        dscps |= {dm.dscp(level) for level in range(9)}
    sizes = {"layers": cfg.layers, "reuse_bytes": cfg.reuse_bytes, "kv_bytes": cfg.kv_bytes,
             "requests": cfg.requests + cfg.warmup}
    kv = tb.popen_in(2, [py, "-m", "laxflow.testbed.mooncake_traffic", "mc_kvstore",
                         json.dumps(dict(sizes, address=tb.address(2), segment_dscps=sorted(dscps)))],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=quiet(None))
    dec = tb.popen_in(3, [py, "-m", "laxflow.testbed.mooncake_traffic", "mc_decode",
                          json.dumps(dict(sizes, address=tb.address(3)))],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=quiet(env(3)))
    servers = [kv, dec]
    from laxflow.testbed.procs import READY_TIMEOUT_S, readline_within

    said = []
    for p in servers:
        line = readline_within(p, READY_TIMEOUT_S)
        try:
            said.append(json.loads(line))
        except ValueError:
            for q in servers:
                q.kill()
                q.wait()
            raise UserError(f"contention scenario ({mode}, mooncake): a Mooncake target did not start "
                            f"(said {line.strip()[-200:]!r})") from None
    return servers, {"transport": "mooncake", "mode": mode, "name": cfg.name, "kv_segments": said[0]["segments"],
                     "kv_base": said[0]["base"], "decode_target": said[1]["target"], "decode_base": said[1]["base"]}


def verify_writes(dec: Any, timeout: float = 60.0) -> dict[str, int]:
    """Ask the decode target to check every slot the ranks wrote; ``{"verified", "bad"}``."""
    from laxflow.testbed.procs import readline_within

    dec.stdin.write("verify\n")
    dec.stdin.flush()
    line = readline_within(dec, timeout)
    return json.loads(line) if line.strip() else {"verified": 0, "bad": -1}


def main() -> None:
    """``python -m laxflow.testbed.mooncake_traffic ROLE CONFIG_JSON``: one Mooncake role in a host namespace."""
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))


if __name__ == "__main__":
    main()
