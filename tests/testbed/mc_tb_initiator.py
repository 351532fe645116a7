"""Initiator of test_mooncake_testbed.py: laxflow's Mooncake wrapper under the shim, in a host namespace.

argv: JSON {"local", "target", "addr", "shm", "hooks"}.  Runs, through
``laxflow.adapters.mooncake.TransferEngine`` gated by the node daemon
(segment ``shm``; deadlines through its hooks server):

1. a WRITE (request 1, stage 3, deadline) and a READ (request 2, stage 1);
2. the ordering part: a high-level WRITE H1 (request 3, stage 3, a tight
   deadline), then a low-level READ L (request 4, stage 1, a far layer),
   then another high-level WRITE H2 (request 5) -- submitted back to back,
   so that L is announced before H2.

Prints one JSON line: sha256 of each local region, the wrapper's records
(permits and times), the submit times, and the connection it marked.
"""

import dataclasses
import hashlib
import json
import sys
import time

import numpy as np

from laxflow.adapters.gate import GateConfig
from laxflow.adapters.mooncake import TransferEngine
from laxflow.adapters.mooncake_config import MooncakeAdapterConfig
from laxflow.hooks.client import HooksClient
from laxflow.protocol.shm import Stage

MB = 1 << 20
# (offset, length) in both buffers
REGIONS = {"w1": (0, 2 * MB), "r2": (2 * MB, 2 * MB), "h1": (4 * MB, 4 * MB), "l4": (8 * MB, 2 * MB),
           "h5": (10 * MB, 2 * MB)}
SIZE = 12 * MB

cfg = json.loads(sys.argv[1])
hooks = HooksClient(cfg["hooks"], timeout_ms=2000)
config = MooncakeAdapterConfig(gate=GateConfig(shm_name=cfg["shm"]),
                               on_deadline=lambda r, d: hooks.register_request(str(r), d, 0))
eng = TransferEngine(config=config)
assert eng.initialize(cfg["local"], "P2PHANDSHAKE", "tcp", "") == 0
buf = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
for name in ("r2", "l4"):  # what reads bring must not be there already
    off, n = REGIONS[name]
    buf[off : off + n] = 0
assert eng.register_memory(buf.ctypes.data, SIZE) == 0
target, remote = cfg["target"], cfg["addr"]


def args(name):
    off, n = REGIONS[name]
    return target, [buf.ctypes.data + off], [remote + off], [n]


# 1. one write, one read
assert eng.submit("write", *args("w1"), request=1, stage=Stage.P2D, layer=0, deadline=time.time() + 5).result() == 0
assert eng.submit("read", *args("r2"), request=2, stage=Stage.REUSE, layer=1).result() == 0

# 2. high, low, high: the low read is announced before the second high write
submitted = {}
futures = {}
for name, op, request, stage, layer, deadline in (("h1", "write", 3, Stage.P2D, 0, 0.3), ("l4", "read", 4, Stage.REUSE, 6, None),
                                                  ("h5", "write", 5, Stage.P2D, 0, 0.3)):
    submitted[name] = time.monotonic()
    futures[name] = eng.submit(op, *args(name), request=request, stage=stage, layer=layer,
                               deadline=None if deadline is None else time.time() + deadline)
    time.sleep(0.02)  # the daemon sees them in this order
assert all(f.result(timeout=120) == 0 for f in futures.values())

peer = eng._peers[target]
out = {
    "sha": {name: hashlib.sha256(buf[off : off + n].tobytes()).hexdigest() for name, (off, n) in REGIONS.items()},
    "regions": REGIONS,
    "records": [dataclasses.asdict(r) for r in eng.records],
    "submitted": submitted,
    "data_port": peer.data_port,
    "local_ports": sorted({s.local[1] for s in peer.sockets}),
    "gate": eng.gate.stats,
    "stats": eng.stats,
}
eng.close()
hooks.close()
print(json.dumps(out), flush=True)
