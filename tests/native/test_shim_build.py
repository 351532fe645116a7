"""What liblaxflow_shim.so exports, links and loads into."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXPECTED = {
    "IBVERBS_1.1": "A",
    "LAXFLOW_SHIM_1.0": "A",
    "LAXFLOW_SHIM_1.1": "A",
    "accept": "T",
    "accept4": "T",
    "connect": "T",
    "dlopen": "T",
    "listen": "T",
    "send": "T",
    "sendmsg": "T",
    "write": "T",
    "writev": "T",
    "ibv_close_device@@IBVERBS_1.1": "T",
    "ibv_create_qp@@IBVERBS_1.1": "T",
    "ibv_destroy_qp@@IBVERBS_1.1": "T",
    "ibv_modify_qp@@IBVERBS_1.1": "T",
    "ibv_open_device@@IBVERBS_1.1": "T",
    "laxflow_shim_active@@LAXFLOW_SHIM_1.0": "T",
    "laxflow_shim_attach_denied@@LAXFLOW_SHIM_1.1": "T",
    "laxflow_shim_clear_tag@@LAXFLOW_SHIM_1.0": "T",
    "laxflow_shim_layer_boundary@@LAXFLOW_SHIM_1.0": "T",
    "laxflow_shim_progress@@LAXFLOW_SHIM_1.0": "T",
    "laxflow_shim_set_tag@@LAXFLOW_SHIM_1.0": "T",
}


def nm(*args: str, lib: Path) -> list[str]:
    return subprocess.run(["nm", "-D", *args, str(lib)], capture_output=True, text=True, check=True).stdout.splitlines()


def test_only_intended_symbols_exported(shim_lib):
    exported = {}
    for line in nm("--defined-only", lib=shim_lib):
        _, kind, name = line.split()
        exported[name] = kind
    assert exported == EXPECTED


def test_plain_c_library_linked_against_real_libibverbs(shim_lib):
    undefined = [line.split()[-1] for line in nm("--undefined-only", lib=shim_lib)]
    assert not [s for s in undefined if s.startswith(("Py", "_Py"))]
    needed = re.findall(r"NEEDED.*\[(.*)\]", subprocess.run(["readelf", "-d", str(shim_lib)], capture_output=True,
                                                             text=True, check=True).stdout)
    assert "libibverbs.so.1" in needed


def test_shim_path_command_prints_the_library(shim_lib):
    out = subprocess.run([str(Path(sys.executable).parent / "laxflow"), "shim-path"], capture_output=True,
                         text=True, check=True).stdout
    assert Path(out.strip()) == shim_lib


def test_loads_into_any_process_and_survives_fork(shim_lib):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    script = "for i in 1 2 3; do echo line$i | tr a-z A-Z; done; (sleep 0 &); wait"
    ref = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True)
    env["LD_PRELOAD"] = str(shim_lib)
    under = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert (under.stdout, under.stderr) == (ref.stdout, ref.stderr)


def test_run_rejects_bad_dscp():
    proc = subprocess.run([str(Path(sys.executable).parent / "laxflow"), "run", "--dscp", "64", "--", "true"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "laxflow: error: --dscp: expected an integer 0..63, got 64"


def test_run_warns_once_per_invisible_path():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD", "UCX_", "NCCL_"))}
    cmd = [str(Path(sys.executable).parent / "laxflow"), "run", "--dscp", "8", "--", "true"]
    quiet = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert "warning" not in quiet.stderr
    env.update(NCCL_GIN_ENABLE="1", UCX_TLS="rc_mlx5,cuda_copy", NVSHMEM_IB_ENABLE_IBGDA="1")
    loud = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    warnings = [line for line in loud.stderr.splitlines() if line.startswith("laxflow run: warning: ")]
    assert len(warnings) == 3
    assert "NCCL_GIN_ENABLE" in warnings[0] and "rc_mlx5" in warnings[1] and "NVSHMEM_IB_ENABLE_IBGDA" in warnings[2]
    assert "laxflow.adapters.nixl.NixlAgent" in warnings[1] and "LaxflowNixlConnector" in warnings[1]
    env.update(NCCL_GIN_ENABLE="0", UCX_TLS="tcp,cuda_copy", NVSHMEM_IB_ENABLE_IBGDA="0")
    assert "warning" not in subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr


def test_run_rejects_bad_max_defer():
    proc = subprocess.run([str(Path(sys.executable).parent / "laxflow"), "run", "--max-defer-ms", "0", "--", "true"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "laxflow: error: --max-defer-ms: expected 1..3600000, got 0"
