"""Calibration of the testbed's simulator model, measured on the fabric.

:func:`calibrate` is called by ``bench/testbed_fidelity.py`` (root, main
thread) with a :class:`~laxflow.testbed.fabric.Testbed` that is up and idle,
before the scenario's modes run. It measures what the fluid model cannot
know from sizes and rates:

- **per-message host overhead, per stage**: one message alone at the
  scenario's size for that stage, on the path and with the protocol the
  scenario uses, ``reps`` times with idle gaps: stage 1 a read (h0 asks the
  scenario's own kvstore worker on h2, times request -> last byte in), stage
  2 one direction of an all_to_all, h0 -> h1 (h1 acknowledges once it has
  all the bytes), stage 3 a KV write h0 -> h3 to the
  scenario's own decode worker (times first byte -> its acknowledgement).
  The overhead is the median time minus the model's time for the same
  probe alone (:func:`laxflow.testbed.sim_model.alone_s`: its frames, and
  the read's request or the acknowledgement, through the HTB trees, whose
  buckets let an idle path's first ~10 frames per hop through at once):
  thread wake-ups, system calls, the first round
  trips of an idle connection, and whatever else the model lacks;
- **sendall's duration, stages 2 and 3**: a sent message completes (the
  worker reports COMPLETION to its daemon) when ``sendall`` returns, i.e.
  when the socket buffer has taken it, long before its bytes are out;
- **the compute sleep**: ``time.sleep(compute_s)`` in a host namespace,
  ``reps`` times (the scenario's compute is that sleep; on a loaded box it
  oversleeps).

The permit latency is not measured here: it is the daemons' own submit ->
permit wait of the "on" run (``permit_wait_ms_prefill``), which
:func:`laxflow.testbed.sim_model.ModelParams.with_permits` takes.

``python -m laxflow.testbed.calibrate sink|probe CONFIG_JSON`` are the two
processes (inside host namespaces); nothing here needs a daemon.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from laxflow.errors import UserError
from laxflow.testbed.fabric import Testbed, parse_rate
from laxflow.testbed.scenario import ScenarioConfig
from laxflow.testbed.sim_model import GOODPUT, HDR_BYTES, KVRESP_BYTES, ModelParams, alone_s
from laxflow.testbed.sim_wire import HEADERS
from laxflow.testbed.worker import ACK, HDR, KVREQ, KVRESP, Tagger, listen_on, recv_discard, recv_exact, serve_acked

PORTS = {"kv": 7301, "decode": 7302, "sink": 7303}
REPS = 9
GAP_S = 0.05  # idle between two probes: each message is alone and meets an idle connection, as a layer's does


def sink(cfg: dict[str, Any]) -> None:
    """Stage-2 receiver (h1): per ``HDR``, drains the bytes and acknowledges with ``ACK``."""
    ls = listen_on(cfg["port"])
    conn, _ = ls.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    serve_acked(conn)


def _acked_send(sock: socket.socket, rep: int, payload: bytes) -> tuple[float, float]:
    """One ``HDR`` + payload message alone: (seconds until acknowledged, seconds ``sendall`` took)."""
    t0 = time.perf_counter()
    sock.sendall(HDR.pack(rep, 0, len(payload)) + payload)
    t1 = time.perf_counter()
    recv_exact(sock, ACK.size)
    return time.perf_counter() - t0, t1 - t0


def probe(cfg: dict[str, Any]) -> None:
    """h0: ``reps`` rounds of one read, one all_to_all message and one KV write, each alone; then the sleeps."""
    tag = Tagger("sockopt")  # DSCP 0: alone, the class changes nothing
    kv = tag.connect((cfg["kvstore"], PORTS["kv"]), 0, 1)
    a2a = tag.connect((cfg["peer"], PORTS["sink"]), 0, 2)
    dec = tag.connect((cfg["decode"], PORTS["decode"]), 0, 3)
    a2a_payload, kv_payload = bytes(cfg["a2a_bytes"]), bytes(cfg["kv_bytes"])
    times: dict[str, list[float]] = {"1": [], "2": [], "3": []}
    returned: dict[str, list[float]] = {"2": [], "3": []}  # how long sendall took
    for rep in range(cfg["reps"]):
        time.sleep(GAP_S)
        t0 = time.perf_counter()
        kv.sendall(KVREQ.pack(rep, 0, cfg["reuse_bytes"], -1))
        recv_exact(kv, KVRESP.size)
        recv_discard(kv, cfg["reuse_bytes"])
        times["1"].append(time.perf_counter() - t0)
        for stage, sock, payload in (("2", a2a, a2a_payload), ("3", dec, kv_payload)):
            time.sleep(GAP_S)
            total, sent = _acked_send(sock, rep, payload)
            times[stage].append(total)
            returned[stage].append(sent)
    sleeps = []
    for _ in range(cfg["reps"]):
        t0 = time.perf_counter()
        time.sleep(cfg["compute_s"])
        sleeps.append(time.perf_counter() - t0)
    for sock in (kv, a2a, dec):
        sock.close()
    print(json.dumps({"times": times, "returned": returned, "sleeps": sleeps}), flush=True)


def message_bytes(cfg: ScenarioConfig) -> dict[str, int]:
    """Payload bytes on the wire per stage's message (application headers included), as the workers send them."""
    return {"1": cfg.reuse_bytes + KVRESP_BYTES, "2": cfg.a2a_bytes + HDR_BYTES, "3": cfg.kv_bytes + HDR_BYTES}


def _port_counts(tb: Testbed, dev: str) -> tuple[int, int, int]:
    """A switch port's (veth tx_bytes, HTB bytes, HTB packets): the veth counts a GSO super-packet's
    headers once, HTB charges every segment's, and counts segments."""
    tx = int(tb.exec_in("sw", ["cat", f"/sys/class/net/{dev}/statistics/tx_bytes"]).stdout)
    root = next(q for q in json.loads(tb.exec_in("sw", ["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout)
                if q.get("kind") == "htb")
    return tx, int(root["bytes"]), int(root["packets"])


def skb_payload(before: tuple[int, int, int], after: tuple[int, int, int], pure_acks: int) -> float:
    """Mean payload bytes per data packet the port's HTB dequeued (a GSO super-packet or one frame).

    HTB bytes = payload + 66 per segment; the veth's tx_bytes = payload + 66
    per packet it carried; so packets = (tx - payload) / 66, of which
    ``pure_acks`` carried no payload.
    """
    tx, htb, segs = (a - b for a, b in zip(after, before))
    payload = htb - HEADERS * segs
    skbs = (tx - payload) / HEADERS - pure_acks
    if payload <= 0 or skbs <= 0:
        raise UserError("testbed calibration: a switch port moved no data during the probes")
    return payload / skbs


def calibrate(tb: Testbed, cfg: ScenarioConfig, reps: int = REPS) -> tuple[ModelParams, dict[str, Any]]:
    """Measure on the idle fabric; returns the model's parameters and the raw measurements (for the JSON)."""
    py = sys.executable
    common = {"kv_port": PORTS["kv"], "decode_port": PORTS["decode"], "tagger": "sockopt",
              "dscp": {"1": 0, "2": 0, "3": 0}, "ack_dscp": 0}
    servers = [
        tb.popen_in(2, [py, "-m", "laxflow.testbed.worker", "kvstore", json.dumps(common)]),
        tb.popen_in(3, [py, "-m", "laxflow.testbed.worker", "decode", json.dumps(common)]),
        tb.popen_in(1, [py, "-m", "laxflow.testbed.calibrate", "sink", json.dumps({"port": PORTS["sink"]})]),
    ]
    try:
        pcfg = {"kvstore": tb.address(2), "peer": tb.address(1), "decode": tb.address(3), "reps": reps,
                "a2a_bytes": cfg.a2a_bytes, "reuse_bytes": cfg.reuse_bytes, "kv_bytes": cfg.kv_bytes,
                "compute_s": cfg.compute_ms / 1000}
        ports = {"2": tb.switch_port(1), "3": tb.switch_port(3)}  # only the a2a's / the writes' data go there
        before = {k: _port_counts(tb, dev) for k, dev in ports.items()}
        p = tb.popen_in(0, [py, "-m", "laxflow.testbed.calibrate", "probe", json.dumps(pcfg)],
                        stdout=subprocess.PIPE)
        out, _ = p.communicate(timeout=120 + reps * 10)
        # the sender's packets without payload: its ACK of each probe's acknowledgement, and the connection's
        # SYN, handshake ACK, FIN and last ACK
        skb = {k: skb_payload(before[k], _port_counts(tb, dev), reps + 4) for k, dev in ports.items()}
        if p.returncode != 0 or not out.strip():
            raise UserError(f"testbed calibration: the probe on h0 failed (exit {p.returncode})")
        raw = json.loads(out)
    finally:
        for s in servers:
            s.kill()
            s.wait()
    goodput = parse_rate(cfg.rate) / 8 * GOODPUT
    nbytes = message_bytes(cfg)
    skb_bytes = {1: (skb["2"] + skb["3"]) / 2, 2: skb["2"], 3: skb["3"]}
    model = {k: alone_s(cfg, int(k), skb_bytes[int(k)]) for k in nbytes}  # the model's own wire (HTB buckets included) alone
    # signed: what the testbed's lone message takes beyond (or short of) the model's lone message
    overhead = {int(k): statistics.median(v) - model[k] for k, v in raw["times"].items()}
    sendall = {1: 0.0, **{int(k): statistics.median(v) for k, v in raw["returned"].items()}}
    params = ModelParams(
        overhead_s=overhead, skb_bytes=skb_bytes,
        overhead_samples_s={int(k): tuple(t - model[k] for t in v) for k, v in raw["times"].items()}, compute_s=statistics.fmean(raw["sleeps"]), sendall_s=sendall,
        sources={"overhead_s": f"calibration: one message alone per stage on the idle fabric, median of {reps}, "
                               "minus the model's time for it alone (its frames through the HTB trees)",
                 "compute_s": f"calibration: time.sleep(compute_s) in h0's namespace, mean of {reps}",
                 "skb_bytes": "calibration: payload per packet (GSO super-packet) the switch port's HTB dequeued "
                              "during the probes, from its veth tx_bytes and HTB counters less the sender's pure ACKs: "
                              "stage 2 on p1, stage 3 on p3, stage 1 their mean (the read's port carries other ACKs)",
                 "sendall_s": f"calibration: sendall's duration for the stage-2 and stage-3 message alone, median of "
                              f"{reps} (stage 1: a read completes when its bytes are in)",
                 "permit_s": "none (0) until the on run's measured waits are given"})
    summary = {"reps": reps, "message_bytes": nbytes,
               "alone_ms": {k: _spread(v) for k, v in raw["times"].items()},
               "bytes_at_goodput_ms": {k: round(1000 * nbytes[k] / goodput, 3) for k in nbytes},
               "model_alone_ms": {k: round(1000 * model[k], 3) for k in nbytes},
               "sendall_ms": {k: _spread(v) for k, v in raw["returned"].items()},
               "sleep_ms": _spread(raw["sleeps"]), "skb_bytes": {k: round(v) for k, v in skb.items()}}
    return params, summary


def _spread(xs: list[float]) -> dict[str, float]:
    ms = sorted(1000 * x for x in xs)
    return {"median": round(statistics.median(ms), 3), "min": round(ms[0], 3), "max": round(ms[-1], 3)}


def main() -> None:
    role, cfg = sys.argv[1], json.loads(sys.argv[2])
    {"sink": sink, "probe": probe}[role](cfg)


if __name__ == "__main__":
    main()

