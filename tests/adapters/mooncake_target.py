"""A Mooncake engine in its own process: the peer of the two-process test.

Prints {"port", "addr", "size"} as JSON, then for each line on stdin
("OFFSET LENGTH") prints the sha256 of that part of its buffer; exits on EOF.
"""

import hashlib
import json
import sys

import numpy as np
from mooncake.engine import TransferEngine

size = int(sys.argv[1])
engine = TransferEngine()
assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = np.zeros(size, np.uint8)
assert engine.register_memory(buf.ctypes.data, size) == 0
print(json.dumps({"port": engine.get_rpc_port(), "addr": buf.ctypes.data, "size": size}), flush=True)
for line in sys.stdin:
    off, length = (int(x) for x in line.split())
    print(hashlib.sha256(buf[off : off + length].tobytes()).hexdigest(), flush=True)
