"""One rank of the Gloo all_to_all test (run under `laxflow run`).

argv: rank world port rounds [shm_name].  With shm_name, each all_to_all runs
inside GlooCollectives.collective (daemon mode, no shim needed).  Prints one
JSON line: whether every round's result was right, and the local TCP ports
this process used (for the capture).
"""

import json
import sys

import torch
import torch.distributed as dist

from contextlib import nullcontext

from laxflow.adapters.gate import GateConfig
from laxflow.adapters.gloo import GlooCollectives
from laxflow.adapters.sockets import tcp_sockets

rank, world, port, rounds = (int(a) for a in sys.argv[1:5])
coll = GlooCollectives(GateConfig(shm_name=sys.argv[5])) if len(sys.argv) > 5 else None
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
chunk = 16384
ok = True
for r in range(rounds):
    send = torch.arange(world * chunk, dtype=torch.float32) + 1000.0 * rank + r
    recv = torch.empty_like(send)
    gate = coll.collective(request=7, layer=r, nbytes=send.numel() * 4) if coll else nullcontext()
    with gate:
        dist.all_to_all_single(recv, send)
    for src in range(world):  # chunk src of recv is chunk `rank` of src's send
        want = torch.arange(rank * chunk, (rank + 1) * chunk, dtype=torch.float32) + 1000.0 * src + r
        ok = ok and torch.equal(recv[src * chunk : (src + 1) * chunk], want)
ports = sorted({s.local[1] for s in tcp_sockets() if s.state == "ESTABLISHED"})
dist.barrier()
print(json.dumps({"rank": rank, "ok": ok, "ports": ports}), flush=True)
dist.destroy_process_group()
if coll is not None:
    coll.close()
