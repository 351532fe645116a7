"""Gloo CPU collectives under the shim: all_to_all among processes, DSCP on the wire."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="extra 'torch' (torch==2.13.0, CPU) not installed")
pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, AsyncSniffer  # noqa: E402
from segment_daemon import SegmentDaemon  # noqa: E402

from laxflow.protocol.shm import EventKind, Gate, Stage  # noqa: E402

LAXFLOW = shutil.which("laxflow") or str(Path(sys.executable).parent / "laxflow")
WORKER = Path(__file__).with_name("gloo_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
@pytest.mark.parametrize("world", [3])
def test_all_to_all_under_laxflow_run_carries_the_dscp(world):
    dscp = 21
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    ready = threading.Event()
    sniffer = AsyncSniffer(iface="lo", started_callback=ready.set, store=True,
                           lfilter=lambda p: IP in p and TCP in p and len(p[TCP].payload) > 0)
    sniffer.start()
    assert ready.wait(5)
    port = free_port()
    procs = [
        subprocess.Popen([LAXFLOW, "run", "--dscp", str(dscp), "--collectives", "gloo", "--", sys.executable, str(WORKER),
                          str(rank), str(world), str(port), "4"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(world)
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        time.sleep(0.2)
        sniffer.stop()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(r["ok"] for r in results), results
    ours = {pt for r in results for pt in r["ports"]} | {port}
    packets = [p for p in sniffer.results if p[TCP].sport in ours and p[TCP].dport in ours]
    assert len(packets) > 10, "no all_to_all traffic captured between the ranks"
    dscps = {p[IP].tos >> 2 for p in packets}
    assert dscps == {dscp}, f"DSCP seen on the ranks' connections: {dscps}"


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
def test_all_to_all_gated_by_the_daemon_carries_the_permit_dscp():
    """Daemon mode without the shim: GlooCollectives submits, waits, marks, completes."""
    world, rounds, dscp = 2, 3, 29
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 1, dscp))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    ready = threading.Event()
    sniffer = AsyncSniffer(iface="lo", started_callback=ready.set, store=True,
                           lfilter=lambda p: IP in p and TCP in p and len(p[TCP].payload) >= 4096)
    sniffer.start()
    assert ready.wait(5)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), str(port), str(rounds), daemon.name],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        time.sleep(0.2)
        sniffer.stop()
    try:
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-2000:]
        results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
        assert all(r["ok"] for r in results), results
        ours = {pt for r in results for pt in r["ports"]}
        packets = [p for p in sniffer.results if p[TCP].sport in ours and p[TCP].dport in ours]
        assert packets, "no all_to_all payload captured between the ranks"
        assert {p[IP].tos >> 2 for p in packets} == {dscp}
        daemon.wait_for(lambda evs: sum(e["kind"] == EventKind.COMPLETION for e in evs) == world * rounds)
        submits = daemon.of_kind(EventKind.SUBMIT)
        assert len(submits) == world * rounds and len({e["pid"] for e in submits}) == world
        assert all(e["stage"] == Stage.COLLECTIVE and e["request_id"] == 7 for e in submits)
        assert sorted(e["layer"] for e in submits) == sorted(list(range(rounds)) * world)
    finally:
        daemon.close()
