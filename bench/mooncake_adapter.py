"""What the Mooncake wrapper adds to a transfer: Mooncake alone vs through laxflow.

    python bench/mooncake_adapter.py --json [--repeats 200]

Two Mooncake engines in this process over TCP on loopback (P2P handshake).
Median and p99 latency in microseconds of one synchronous READ of 4 KiB and
1 MiB:

  raw_us        mooncake.engine.TransferEngine.transfer_sync_read
  failopen_us   the wrapper with no daemon segment (straight through, unmarked)
  gated_us      the wrapper with a daemon stand-in that opens every gate as
                soon as it drains the SUBMIT (real segment, heartbeat thread,
                0.1 ms drain loop): SUBMIT -> permit -> marking -> transfer ->
                COMPLETION

Needs the extra ``mooncake``.  Numbers are quoted with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
import uuid

import numpy as np

from laxflow.adapters.gate import GateConfig
from laxflow.adapters.mooncake import TransferEngine
from laxflow.adapters.mooncake_config import MooncakeAdapterConfig
from laxflow.protocol.shm import EventKind, Gate, Segment


class GrantAll:
    """A daemon stand-in: beats, drains, opens every submitted message's gate."""

    def __init__(self) -> None:
        self.name = f"/lxf-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.seg = Segment.create(self.name)
        self.seg.heartbeat()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        beat = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - beat > 0.01:
                self.seg.heartbeat()
                beat = now
            for ev in self.seg.drain_events():
                if ev["kind"] == EventKind.SUBMIT:
                    self.seg.set_permit(int(ev["msg_id"]), Gate.OPEN, 1, 38)
            time.sleep(0.0001)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.seg.close()


def timed(fn, repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rc = fn()
        samples.append((time.perf_counter() - t0) * 1e6)
        assert rc == 0, rc
    samples.sort()
    return {"p50": round(statistics.median(samples), 1), "p99": round(samples[int(0.99 * (len(samples) - 1))], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    from mooncake.engine import TransferEngine as Mooncake

    a, b = Mooncake(), Mooncake()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    size = 1 << 20
    local, remote = np.zeros(size, np.uint8), np.ones(size, np.uint8)
    a.register_memory(local.ctypes.data, size)
    b.register_memory(remote.ctypes.data, size)
    target = f"127.0.0.1:{b.get_rpc_port()}"
    daemon = GrantAll()
    failopen = TransferEngine(a, MooncakeAdapterConfig(gate=GateConfig(shm_name=f"/lxf-bench-none-{os.getpid()}")), "tcp")
    gated = TransferEngine(a, MooncakeAdapterConfig(gate=GateConfig(shm_name=daemon.name)), "tcp")
    out: dict = {"machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
                 "repeats": args.repeats}
    try:
        for n, label in ((4096, "4KiB"), (size, "1MiB")):
            a.transfer_sync_read(target, local.ctypes.data, remote.ctypes.data, n)  # connect, warm
            out[f"raw_us_{label}"] = timed(lambda: a.transfer_sync_read(target, local.ctypes.data, remote.ctypes.data, n), args.repeats)
            out[f"failopen_us_{label}"] = timed(
                lambda: failopen.transfer_sync_read(target, local.ctypes.data, remote.ctypes.data, n), args.repeats)
            out[f"gated_us_{label}"] = timed(
                lambda: gated.transfer_sync_read(target, local.ctypes.data, remote.ctypes.data, n, request=1), args.repeats)
        out["gated_released"] = gated.gate.stats["released"]
    finally:
        failopen.close()
        gated.close()
        daemon.close()
    print(json.dumps(out) if args.json else json.dumps(out, indent=2), flush=True)
    os._exit(0)  # Mooncake's engine threads do not join at interpreter exit


if __name__ == "__main__":
    main()
