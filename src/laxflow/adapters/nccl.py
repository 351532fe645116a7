"""What ``laxflow run --collectives nccl|gloo`` gives a job that runs collectives, besides the preloaded shim.

``laxflow.shim_cli`` calls :func:`apply_run_env` once, on the ``laxflow run``
process, before it execs the job, and only when the job says it runs
collectives (``--collectives``): a job that does not (a Mooncake target, a
serving process's own sockets) gets none of this, so its untagged traffic is
not taken for collectives.  :func:`laxflow.shim.shim_env` then copies the
environment (it already sets ``LD_PRELOAD`` and, for NCCL >= 2.30,
``NCCL_IBVERBS_LIB`` pointing at the shim).  A value the user set is kept.
``nccl`` sets all three variables below; ``gloo`` (CPU collectives over TCP)
only ``LAXFLOW_DEFAULT_STAGE``.

* ``NCCL_IB_TC``: the GRH traffic class of every QP NCCL creates, from
  laxflow's DSCP map (tc = DSCP << 2): the collective class, RMLQ level
  ``min(1 + RLI, K - 1)`` with RLI 0, i.e. level 1 (DSCP 38 for K = 8), or the
  static ``--dscp``.  NCCL has no per-communicator traffic class in its
  public API (``NCCL_IB_TC`` is process-wide; NCCL 2.30 adds
  ``NCCL_GIN_IB_TC`` for GIN only), so the job's QPs share it.
* ``LAXFLOW_DEFAULT_STAGE=2``: tells the shim that QPs and TCP sockets of this
  process without a flow tag carry collective (stage-2) traffic, so the
  daemon's SUBMIT/COMPLETION events the shim derives for them say so.  (The
  shim reads it in its config loader; untagged traffic of a process without
  it stays stage 0.)
* ``NCCL_PROFILER_PLUGIN``: the laxflow profiler plugin
  (``native/nccl_profiler``), when built, so collective start/stop reach the
  daemon (see ``laxflow_nccl_profiler.c``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import MutableMapping

from laxflow.policy.dscp import DscpMap, default_dscp_map

PLUGIN_FILE = "libnccl-profiler-laxflow.so"
COLLECTIVE_LEVEL = 1  # RLI 0 -> RMLQ level min(1 + 0, K - 1) (laxflow.policy.mfs)
COLLECTIVE_STAGE = 2
COLLECTIVES = ("nccl", "gloo")  # the values of ``laxflow run --collectives``


def profiler_plugin_path() -> Path | None:
    """The built NCCL profiler plugin inside the package, or None."""
    path = Path(__file__).resolve().parent.parent / "_native" / PLUGIN_FILE
    return path if path.is_file() else None


def collective_tc(dscp: int | None = None, dscp_map: DscpMap | None = None) -> int:
    """NCCL_IB_TC for collectives: the static DSCP, else the collective level's."""
    if dscp is None:
        dscp = (dscp_map or default_dscp_map()).dscp(COLLECTIVE_LEVEL)
    return dscp << 2


def apply_run_env(
    env: MutableMapping[str, str] | None = None, dscp: int | None = None, dscp_map: DscpMap | None = None,
    collectives: str = "nccl",
) -> None:
    """Add what a job running ``collectives`` (``nccl`` or ``gloo``) needs to ``env`` (default: this process's)."""
    if collectives not in COLLECTIVES:
        raise ValueError(f"collectives: expected one of {', '.join(COLLECTIVES)}, got {collectives!r}")
    env = os.environ if env is None else env
    env.setdefault("LAXFLOW_DEFAULT_STAGE", str(COLLECTIVE_STAGE))
    if collectives != "nccl":
        return
    env.setdefault("NCCL_IB_TC", str(collective_tc(dscp, dscp_map)))
    plugin = profiler_plugin_path()
    if plugin is not None:
        env.setdefault("NCCL_PROFILER_PLUGIN", str(plugin))
