"""A NIXL agent in its own process, the target of the adapter's tests.

Registers one DRAM buffer of SIZE bytes (argv[1]) holding ``i % 251``
(argv[2] ``sm``: a UCX backend without peer error handling, which UCX's
shared-memory transports need),
prints one JSON line (its agent metadata and descriptor list, hex-encoded;
the buffer's address), then answers stdin lines: ``sha OFFSET LEN`` -> the
SHA-256 of that slice; ``notifs [N]`` -> the notification messages received so
far (JSON list), once there are at least N of them or after 10 s; ``quit``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config


def main() -> None:
    size = int(sys.argv[1])
    out = os.fdopen(os.dup(1), "w")  # the replies; NIXL logs to stdout, sent to stderr from here on
    os.dup2(2, 1)
    if sys.argv[2:] == ["sm"]:
        agent = nixl_agent(f"lxf-target-{os.getpid()}", nixl_agent_config(backends=[]))
        agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
    else:
        agent = nixl_agent(f"lxf-target-{os.getpid()}", nixl_agent_config(backends=["UCX"]))
    buf = (np.arange(size) % 251).astype(np.uint8)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    descs = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")
    print(json.dumps({"metadata": agent.get_agent_metadata().hex(), "descs": agent.get_serialized_descs(descs).hex(),
                      "addr": buf.ctypes.data, "name": agent.name}), file=out, flush=True)
    notifs: list[str] = []
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "sha":
            off, n = int(cmd[1]), int(cmd[2])
            print(hashlib.sha256(buf[off : off + n].tobytes()).hexdigest(), file=out, flush=True)
        elif cmd[0] == "notifs":
            # A notification lands after the initiator saw its transfer DONE: wait (up to 10 s) for the count asked.
            want, end = int(cmd[1]) if len(cmd) > 1 else 0, time.monotonic() + 10.0
            while True:
                for msgs in agent.get_new_notifs().values():
                    notifs.extend(m.decode() for m in msgs)
                if len(notifs) >= want or time.monotonic() > end:
                    break
                time.sleep(0.005)
            print(json.dumps(notifs), file=out, flush=True)


if __name__ == "__main__":
    main()
