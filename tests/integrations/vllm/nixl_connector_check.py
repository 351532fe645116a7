"""LaxflowNixlConnector around vLLM's real NixlConnector, both sides, in a process of its own.

Run by test_nixl_connector.py (argv[1]: a scratch folder): vLLM's platform
set to CPU and a one-process gloo group are process-wide state, and NIXL's
agent is one per worker.  Prints one JSON line of what it saw.

Scheduler side: a real vLLM Scheduler whose connector is LaxflowNixlConnector
wrapping NixlPullConnector (kv_consumer) takes a request whose KV a remote
prefill holds (kv_transfer_params as vLLM's proxy gives them).  Worker side:
the real NixlPullConnectorWorker is built (CPU, block size 32), its NIXL agent
wrapped; the step's metadata is bound, and a READ made and posted through the
agent the inner worker calls (``connector_worker.nixl_wrapper``), with vLLM's
notification, from a NIXL target in another process, while a test daemon
(the shared-memory segment) decides.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "adapters")]


def main() -> None:
    scratch = Path(sys.argv[1])
    from segment_daemon import SegmentDaemon
    from vllm_harness import make_request, make_scheduler, step

    from laxflow.protocol.shm import EventKind, Gate

    daemon = SegmentDaemon(lambda ev: (Gate.OPEN, 1, 36))
    os.environ["LAXFLOW_SHM_NAME"] = daemon.name
    out: dict = {}
    from vllm.config import KVTransferConfig

    ktc = KVTransferConfig(kv_connector="LaxflowNixlConnector",
                           kv_connector_module_path="laxflow.integrations.vllm.nixl", kv_role="kv_consumer",
                           kv_buffer_device="cpu", engine_id="decode-0", kv_connector_extra_config={})
    sched = make_scheduler(scratch, kv_transfer_config=ktc)
    conn = sched.connector
    out["scheduler"] = [type(conn).__name__, type(conn.inner).__name__]
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[0, 1, 2]],
              "remote_engine_id": "prefill-0", "remote_request_id": "prefill-r1", "remote_host": "127.0.0.1",
              "remote_port": 5599, "tp_size": 1}
    sched.add_request(make_request("r1", 40, max_tokens=2, extra_args={"kv_transfer_params": params,
                                                                       "ttft_slo_ms": 500}))
    meta = step(sched).kv_connector_metadata
    out["meta"] = [type(meta).__name__, type(meta.inner).__name__, sorted(meta.inner.reqs_to_recv),
                   meta.inner.reqs_to_recv["r1"].remote.request_id]

    # ---- worker side
    import torch
    import vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker as base_worker
    import vllm.platforms as platforms
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    platforms._current_platform = base_worker.current_platform = CpuPlatform()  # vLLM without its CPU build: unset
    vc = sched.vllm_config
    vc.cache_config.kv_cache_layout = "NHD"  # resolved by the engine core in a real run
    vc.cache_config.block_size = 32  # CPU attention's block sizes are multiples of 32
    kcc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer.0", "layer.1"], FullAttentionSpec(block_size=32, num_kv_heads=4, head_size=16, dtype=torch.float32))])
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{scratch / 'dist'}")
        initialize_model_parallel(1, 1)
        worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
    inner_worker = worker.inner.connector_worker
    agent = worker.agent
    out["worker"] = [type(worker).__name__, type(worker.inner).__name__, inner_worker.nixl_wrapper is agent,
                     type(agent.inner).__name__]
    worker.bind_connector_metadata(meta)

    # a READ as NixlPullConnectorWorker._read_blocks makes it, through the agent it calls
    size = 1 << 20
    target = subprocess.Popen([sys.executable, str(HERE.parents[1] / "adapters" / "nixl_target.py"), str(size)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    info = json.loads(target.stdout.readline())
    nixl = inner_worker.nixl_wrapper
    peer = nixl.add_remote_agent(bytes.fromhex(info["metadata"]))
    local = torch.zeros(size, dtype=torch.uint8)
    nixl.register_memory([(local.data_ptr(), size, 0, "")], "DRAM")
    half = size // 2
    local_side = nixl.prep_xfer_dlist("NIXL_INIT_AGENT",
                                      [(local.data_ptr(), half, 0), (local.data_ptr() + half, half, 0)], "DRAM")
    remote_side = nixl.prep_xfer_dlist(peer, [(info["addr"], half, 0), (info["addr"] + half, half, 0)], "DRAM")
    handle = nixl.make_prepped_xfer("READ", local_side, [0, 1], remote_side, [0, 1], notif_msg=b"prefill-r1:1")
    nixl.transfer(handle)
    end = time.monotonic() + 20
    while (state := nixl.check_xfer_state(handle)) == "PROC" and time.monotonic() < end:
        time.sleep(0.002)
    nixl.release_xfer_handle(handle)
    out["state"] = state
    target.stdin.write(f"sha 0 {size}\n")
    target.stdin.flush()
    out["bytes_match"] = target.stdout.readline().strip() == hashlib.sha256(local.numpy().tobytes()).hexdigest()
    daemon.wait_for(lambda evs: any(e["kind"] == EventKind.COMPLETION for e in evs))
    out["submits"] = [{k: e[k] for k in ("request_id", "stage", "layer", "bytes")}
                      for e in daemon.of_kind(EventKind.SUBMIT)]
    out["notifs"] = json.loads((target.stdin.write("notifs 1\n"), target.stdin.flush(), target.stdout.readline())[2])
    out["records"] = [[r.op, r.remote_agent == peer, r.level, r.dscp] for r in agent.records]
    target.stdin.write("quit\n")
    target.stdin.close()
    target.wait(timeout=30)
    worker.shutdown()
    out["gate_closed"] = agent.gate._closed
    daemon.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
