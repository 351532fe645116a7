"""Client of the shim-path test, run under `laxflow run`: the wrapper writes
socket flow tags only (its own setsockopt is switched off), so any DSCP on
the wire comes from the preloaded shim reading the tags.

argv: target_json size dscp_expected.  Prints the local ports used, as JSON.
"""

import json
import sys

import numpy as np

import laxflow.adapters.mooncake as mc

mc.set_dscp = lambda fd, inode, dscp: True  # the shim alone marks the sockets
info = json.loads(sys.argv[1])
size = int(sys.argv[2])
eng = mc.TransferEngine()
assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
assert eng.register_memory(buf.ctypes.data, size) == 0
target = f"127.0.0.1:{info['port']}"
for request in (1, 2):
    assert eng.transfer_sync_write(target, buf.ctypes.data, info["addr"], size, request=request, layer=request) == 0
ports = sorted({s.local[1] for s in eng._peers[target].sockets})
print(json.dumps({"ports": ports, "stats": eng.gate.stats}), flush=True)
eng.close()
