"""The Mooncake wrapper's socket flow tags through the preloaded shim (daemon mode).

The client runs under `laxflow run --shm-name <test segment>`; the wrapper's
own IP_TOS marking is switched off there, so the DSCP seen on lo is the
shim's, read from the socket flow tags the wrapper wrote.  Skipped until the
shim reads socket flow tags (counter ``sock_tos_set`` in the layout).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from segment_daemon import SegmentDaemon

from laxflow.protocol.shm import COUNTER_NAMES, EventKind, Gate

pytest.importorskip("mooncake.engine", reason="extra 'mooncake' not installed")
pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, AsyncSniffer  # noqa: E402

HERE = Path(__file__).parent
LAXFLOW = shutil.which("laxflow") or str(Path(sys.executable).parent / "laxflow")
SIZE = 2 << 20


@pytest.mark.skipif("sock_tos_set" not in COUNTER_NAMES, reason="this shim does not read socket flow tags yet")
@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
@pytest.mark.xfail(strict=False, reason="known intermittent bug (about 1 run in 5, also on a quiet machine): the "
                   "second transfer's bytes keep the first one's class (DSCP 37, never 33) on Mooncake's reused "
                   "socket; open, see the adapters issue note")
def test_socket_flow_tags_reach_the_wire_through_the_shim():
    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 2, 37 if ev["request_id"] == 1 else 33))
    peer = subprocess.Popen([sys.executable, str(HERE / "mooncake_target.py"), str(SIZE)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready = threading.Event()
    sniffer = AsyncSniffer(iface="lo", started_callback=ready.set, store=True,
                           lfilter=lambda p: TCP in p and len(p[TCP].payload) > 0)
    try:
        info = peer.stdout.readline()
        sniffer.start()
        assert ready.wait(5)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
        res = subprocess.run([LAXFLOW, "run", "--shm-name", daemon.name, "--", sys.executable,
                              str(HERE / "mooncake_tagged_client.py"), info, str(SIZE)],
                             env=env, capture_output=True, text=True, timeout=120)
        time.sleep(0.3)
        sniffer.stop()
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["stats"]["released"] == 2 and out["ports"], out
        packets = [p for p in sniffer.results if p[TCP].sport in out["ports"]]
        seen = {p[IP].tos >> 2 for p in packets}
        # request 1's first bytes may leave before the connection is known (first contact)
        assert 33 in seen and seen <= {0, 37, 33}, seen
        assert daemon.seg.counters()["sock_tos_set"] >= 1
        assert len(daemon.of_kind(EventKind.COMPLETION)) >= 2
    finally:
        peer.stdin.close()
        peer.wait(timeout=30)
        daemon.close()
