"""Finding the native shim and starting a command under it.

``laxflow shim-path`` and ``laxflow run`` (``laxflow.shim_cli``) call these;
tests and benchmarks use :func:`shim_path` and :func:`shim_env` to run
programs under the shim.  The only environment variables the shim reads are
the ones :func:`shim_env` sets (read once, by the shim's configuration loader).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from laxflow.errors import UserError

SHIM_FILE = "liblaxflow_shim.so"
DEFAULT_SHM_NAME = "/laxflow"


def shim_path() -> Path:
    """Path of liblaxflow_shim.so inside the installed package."""
    path = Path(__file__).resolve().parent / "_native" / SHIM_FILE
    if not path.is_file():
        raise UserError(f"{path}: shim not built; reinstall laxflow (pip install -e .) with libibverbs-dev present")
    return path


@dataclass(frozen=True)
class ShimConfig:
    """How a command runs under the shim.

    dscp: static mode -- every TCP connection and every QP brought to RTR gets
      this DSCP (0..63); no daemon needed (testbeds).
    shm_name: the node daemon's segment (daemon mode, gating and tags).
    stale_ms: daemon heartbeat age after which the shim passes traffic through.
    max_defer_ms: longest a work request waits for its permit before it is
      released anyway (fail open); None keeps the shim's default (300).
    """

    dscp: int | None = None
    shm_name: str = DEFAULT_SHM_NAME
    stale_ms: int | None = None
    max_defer_ms: int | None = None

    def __post_init__(self) -> None:
        if self.dscp is not None and not 0 <= self.dscp <= 63:
            raise UserError(f"--dscp: expected an integer 0..63, got {self.dscp}")
        if not self.shm_name.startswith("/") or "/" in self.shm_name[1:] or len(self.shm_name) > 255:
            raise UserError(f"--shm-name: expected '/name' (one slash, at most 255 chars), got {self.shm_name!r}")
        if self.stale_ms is not None and not 1 <= self.stale_ms <= 3_600_000:
            raise UserError(f"--stale-ms: expected 1..3600000, got {self.stale_ms}")
        if self.max_defer_ms is not None and not 1 <= self.max_defer_ms <= 3_600_000:
            raise UserError(f"--max-defer-ms: expected 1..3600000, got {self.max_defer_ms}")


def shim_env(config: ShimConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command run under the shim."""
    env = dict(os.environ if base is None else base)
    lib = str(shim_path())
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != lib]
    env["LD_PRELOAD"] = " ".join([lib, *preload])
    # NCCL >= 2.30 loads the verbs library named here instead of
    # libibverbs.so(.1); pointing it at the shim reaches the same wrappers
    # as the dlopen hook does for older NCCL.  A user's own choice stays.
    env.setdefault("NCCL_IBVERBS_LIB", lib)
    env["LAXFLOW_SHM_NAME"] = config.shm_name
    if config.dscp is not None:
        env["LAXFLOW_DSCP"] = str(config.dscp)
    else:
        env.pop("LAXFLOW_DSCP", None)
    if config.stale_ms is not None:
        env["LAXFLOW_STALE_MS"] = str(config.stale_ms)
    if config.max_defer_ms is not None:
        env["LAXFLOW_MAX_DEFER_MS"] = str(config.max_defer_ms)
    return env


# UCX transports that ring the NIC's doorbell from user space (mlx5 direct
# verbs), bypassing the ibv_post_send the shim intercepts.
_UCX_DIRECT = ("rc_x", "dc_x", "ud_x", "rc_mlx5", "dc_mlx5", "ud_mlx5", "all", "ib")


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def invisible_paths(env: Mapping[str, str]) -> list[str]:
    """Transports in a job's environment whose traffic the shim cannot see.

    Called once by ``laxflow run`` before it starts the job, which prints each
    as one warning line (the shim itself never prints).  Each names the
    variable that gave it away and what to expect.
    """
    found = []
    if _truthy(env.get("NCCL_GIN_ENABLE")):
        found.append("NCCL_GIN_ENABLE is set: NCCL's GPU-initiated (GIN) transport posts work requests from the GPU; "
                     "the shim can neither see nor gate that traffic")
    ucx_tls = env.get("UCX_TLS", "")
    # "^a,b" excludes transports: what remains cannot be told from it
    tls = [] if ucx_tls.startswith("^") else [t.strip().lower() for t in ucx_tls.split(",")]
    direct = [t for t in tls if t in _UCX_DIRECT]
    if direct:
        found.append(f"UCX_TLS={env['UCX_TLS']}: UCX's mlx5 transports ({', '.join(direct)}) ring the NIC doorbell "
                     "directly (NIXL); the shim sees only their connection set-up: schedule NIXL with "
                     "laxflow.adapters.nixl.NixlAgent (vLLM: LaxflowNixlConnector from laxflow.integrations.vllm.nixl)")
    ibgda = sorted(k for k, v in env.items() if "IBGDA" in k.upper() and _truthy(v))
    if ibgda:
        found.append(f"{', '.join(ibgda)} set: GPU-initiated IBGDA (NVSHMEM, Mooncake's EP) bypasses verbs posting; "
                     "the shim can neither see nor gate that traffic")
    return found


def daemon_status(shm_name: str) -> str | None:
    """None when a live daemon owns the segment, else why the shim will pass through."""
    from laxflow.protocol.shm import Segment, SegmentError

    try:
        seg = Segment.attach(shm_name)
    except SegmentError as exc:
        return str(exc)
    try:
        return None if seg.live() else f"segment {shm_name!r}: daemon heartbeat is stale"
    finally:
        seg.close()


def exec_under_shim(command: list[str], config: ShimConfig) -> None:
    """Replace this process with command, the shim preloaded.  Does not return."""
    if not command:
        raise UserError("run: expected a command after '--' (laxflow run [--dscp N] -- CMD ...)")
    env = shim_env(config)
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise UserError(f"run: {command[0]!r}: command not found") from None
    except PermissionError:
        raise UserError(f"run: {command[0]!r}: not executable") from None
