"""Configuration of the Mooncake wrapper and how its classes combine with Mooncake's.

Three knobs decide the class of a Mooncake transfer; this module is the one
place that combines them (read by :mod:`laxflow.adapters.mooncake`):

* ``MC_IB_TC`` (Mooncake, RDMA only): the GRH ``traffic_class`` byte Mooncake
  writes into every QP it brings to RTR (0..255, DSCP << 2; default unset).
  When the user sets it, that class is a deliberate, process-wide choice: the
  wrapper then still gates every transfer on its permit (the host-side
  software queue, MFS's strict priority at the host) but writes QP tags with
  ``dscp = -1`` so the shim leaves Mooncake's class on the wire.  Unset, the
  permit's DSCP (the RMLQ level's, ``laxflow policy dscp``) goes on the QP.
  Mooncake's TCP transport ignores ``MC_IB_TC``; on TCP the permit's DSCP
  always marks the sockets.
* ``MC_IB_SL`` (Mooncake, RDMA only): the InfiniBand service level (0..15, a
  virtual lane on IB fabrics).  laxflow never changes it: the shim rewrites
  ``grh.traffic_class`` only, so an SL set here keeps its VL on IB while
  RoCE switches queue by DSCP.
* TENT's per-request priority (``PRIO_HIGH``/``MEDIUM``/``LOW`` = 0/1/2,
  Mooncake ``docs/source/design/tent/features/qos.md``): TENT keeps one queue
  per priority per worker, drains them strictly and promotes waiting work
  after ``priority_promotion_timeout_us`` (10 ms).  A transfer reaches TENT
  only once laxflow has permitted it, so TENT orders just the released
  messages; :func:`tent_priority` maps the permit's level onto TENT's three
  so both orders agree (top and collective levels HIGH, the scavenger and the
  lowest level LOW, the rest MEDIUM).  TENT's timed promotion and global slot
  rotation (``shared_quota_shm_path``) are a second scheduler; leave the
  slot rotation off and the promotion timeout long when laxflow schedules.
  In the ``mooncake-transfer-engine-non-cuda`` wheel (0.3.13) the Python
  ``TransferEngine`` can run on TENT (``MC_USE_TENT=1``) but its calls take
  no priority, so every request enters TENT at its default ``PRIO_HIGH`` and
  laxflow's gating alone orders them; the mapping is for callers of TENT's
  own request API.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

from laxflow.adapters.gate import GateConfig
from laxflow.errors import UserError

TENT_PRIO_HIGH, TENT_PRIO_MEDIUM, TENT_PRIO_LOW = 0, 1, 2
_GLOG_MINLOGLEVEL = "_ZN3fLI17FLAGS_minloglevelE"  # glog's FLAGS_minloglevel (C++ name)
log = logging.getLogger(__name__)


def apply_glog_level(env: Mapping[str, str] | None = None) -> int | None:
    """Give Mooncake's glog the ``GLOG_minloglevel`` of ``env`` (default: ours).

    The ``mooncake-transfer-engine`` wheels bundle a glog built with gflags,
    which reads no ``GLOG_*`` environment variable, so Mooncake logs every
    INFO line whatever the user set. Called after ``mooncake.engine`` is
    imported (its glog is then loaded): writes the level (0 INFO .. 3 FATAL)
    into the loaded glog's ``FLAGS_minloglevel``. Returns the level applied,
    or None when the variable is unset or no glog is loaded; a value that is
    not 0..3 is one clear error.
    """
    raw = (os.environ if env is None else env).get("GLOG_minloglevel", "").strip()
    if not raw:
        return None
    try:
        level = int(raw)
    except ValueError:
        level = -1
    if not 0 <= level <= 3:
        raise UserError(f"GLOG_minloglevel: expected 0 (INFO) .. 3 (FATAL), got {raw!r}")
    path = _loaded_glog()
    if path is None:
        return None
    try:
        ctypes.c_int32.in_dll(ctypes.CDLL(path), _GLOG_MINLOGLEVEL).value = level
    except (OSError, ValueError) as exc:  # not the glog we know: its logging stays as it is
        log.debug("cannot set FLAGS_minloglevel in %s: %s", path, exc)
        return None
    return level


def _loaded_glog() -> str | None:
    """Path of the glog shared library mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and "libglog" in os.path.basename(path):
                    return "/" + path
    except OSError:
        return None
    return None


def _env_int(env: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw, 0)
    except ValueError:
        raise UserError(f"{name}: expected an integer {lo}..{hi}, got {raw!r}") from None
    if value == -1:  # Mooncake's own "unset"
        return None
    if not lo <= value <= hi:
        raise UserError(f"{name}: expected an integer {lo}..{hi} (or -1 for unset), got {value}")
    return value


@dataclass(frozen=True)
class MooncakeAdapterConfig:
    """How the wrapper gates and tags Mooncake transfers.

    gate: the daemon's segment and the permit waiter (see GateConfig).
    ib_tc / ib_sl: Mooncake's MC_IB_TC / MC_IB_SL as the job set them (None: unset).
    tag_sockets: on TCP, mark the peer's connections with the permit's DSCP
      (setsockopt on a duplicate descriptor) and write socket flow tags for
      the shim.
    qp_lookup: on RDMA, returns the local QP numbers Mooncake uses towards a
      target, for QP flow tags (Mooncake does not expose them to Python; an
      RDMA deployment passes the shim's view here).  None: QPs keep the
      class the shim gives untagged QPs.
    on_deadline: called once per request with (request_id, deadline) the first
      time a transfer carries a deadline; the shared-memory event has no
      deadline field, so the daemon learns it through the hooks API, e.g.
      ``lambda r, d: hooks.register_request(str(r), d, 0)``.
    drain_timeout_s: a WRITE completes (COMPLETION to the daemon, the caller's
      handle) when the peer has acknowledged its bytes, not when Mooncake has
      handed them to the kernel; waited at most this long (then it completes
      anyway: fail open).
    raise_wait_s: before a connection moves to a more urgent class, wait at
      most this long for its earlier bytes to be acknowledged (packets of one
      connection in two strict-priority queues arrive out of order).
    static_dscp: stage -> DSCP for transfers that run without a permit (no
      daemon, or failing open): marked as a permit of that class would be
      (``laxflow run --dscp`` per stage; the testbed's ``static`` mode).
      Stages not named stay unmarked.
    """

    gate: GateConfig = field(default_factory=GateConfig)
    ib_tc: int | None = None
    ib_sl: int | None = None
    tag_sockets: bool = True
    qp_lookup: Callable[[str], list[int]] | None = None
    on_deadline: Callable[[int, float], None] | None = None
    drain_timeout_s: float = 5.0
    raise_wait_s: float = 0.2
    static_dscp: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for stage, dscp in self.static_dscp.items():
            if stage not in (0, 1, 2, 3) or not 0 <= dscp <= 63:
                raise UserError(f"static_dscp: expected stage 0..3 -> DSCP 0..63, got {stage!r} -> {dscp!r}")
        for name in ("drain_timeout_s", "raise_wait_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise UserError(f"{name}: expected seconds >= 0, got {value!r}")
        if self.ib_tc is not None and not 0 <= self.ib_tc <= 255:
            raise UserError(f"MC_IB_TC: expected 0..255, got {self.ib_tc}")
        if self.ib_sl is not None and not 0 <= self.ib_sl <= 15:
            raise UserError(f"MC_IB_SL: expected 0..15, got {self.ib_sl}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> MooncakeAdapterConfig:
        """The config of a process started by ``laxflow run`` (env read here only)."""
        env = os.environ if env is None else env
        gate = overrides.pop("gate", None) or GateConfig.from_env(env)
        return cls(
            gate=gate,
            ib_tc=_env_int(env, "MC_IB_TC", 0, 255),
            ib_sl=_env_int(env, "MC_IB_SL", 0, 15),
            **overrides,
        )

    def wire_dscp(self, protocol: str, permit_dscp: int | None) -> int:
        """DSCP to put on the wire for a permitted transfer, -1 = leave as is."""
        if permit_dscp is None:
            return -1  # failing open: nothing of laxflow's on the wire
        if protocol == "rdma" and self.ib_tc is not None:
            return -1  # the user's MC_IB_TC stays on Mooncake's QPs
        return permit_dscp


def tent_priority(level: int, levels: int) -> int:
    """TENT priority for RMLQ ``level`` of ``levels`` (``levels`` = scavenger)."""
    if level <= 1:
        return TENT_PRIO_HIGH  # reserved top and RLI 0 (collectives, the next layer's reuse)
    if level >= levels - 1:
        return TENT_PRIO_LOW
    return TENT_PRIO_MEDIUM
