"""Mooncake target of test_mooncake_testbed.py, run in a testbed host's namespace.

argv: local_ip size.  A plain Mooncake engine (P2P handshake over TCP, bound
to the namespace's address) with one registered buffer holding a known
pattern.  Prints {"port", "addr"} as JSON, then answers each stdin line
"OFFSET LENGTH" with the sha256 of that part of its buffer; exits on EOF.
"""

import hashlib
import json
import sys

import numpy as np
from mooncake.engine import TransferEngine

local, size = sys.argv[1], int(sys.argv[2])
engine = TransferEngine()
assert engine.initialize(local, "P2PHANDSHAKE", "tcp", "") == 0
buf = (np.arange(size, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)  # what reads must bring back
assert engine.register_memory(buf.ctypes.data, size) == 0
print(json.dumps({"port": engine.get_rpc_port(), "addr": buf.ctypes.data}), flush=True)
for line in sys.stdin:
    off, length = (int(x) for x in line.split())
    print(hashlib.sha256(buf[off : off + length].tobytes()).hexdigest(), flush=True)
