"""Typed configuration of ``laxflow daemon``, validated once.

:func:`load_config` is the only place that reads the daemon's environment
(``LAXFLOW_SHM_NAME``, ``XDG_RUNTIME_DIR``) and its ``--config`` file; the CLI
hands it the flags, flags win over the file. Everything downstream takes a
:class:`DaemonConfig` and re-checks nothing.

Config file (JSON), every key optional::

    {"node": "node1", "coordinator": "tcp://head:5555", "shm": "/laxflow",
     "ports": "auto" | "ports.json" | [{"name": "eth0", "gbps": 100}],
     "line_rate_gbps": 25, "metrics_port": 9464, "metrics_bind": "127.0.0.1", "hooks": "ipc:///run/laxflow/hooks.sock",
     "keys_dir": "/etc/laxflow/keys", "stale_ms": 100, "poll_us": 50, "rtt_us": 20, "window_bytes": null,
     "spare_share": 0.25, "heartbeat_s": 0.5, "group": "laxflow", "message_ttl_s": 60,
     "mfs": {"levels": 8, "period": 0.001, ...}}

``group``: a Unix group, by name or numeric gid (as Kubernetes'
``supplementalGroups`` gives it); the segment, its doorbell FIFO and the
hooks sockets are then mode 0660 and owned by that group, so serving jobs run by
other users in the group attach (without it they are 0600, the daemon's user
alone, and a job of another user passes through unscheduled).

``line_rate_gbps`` (``--line-rate``): with ``"ports": "auto"``, the rate of
the one port scheduled when no interface reports a link speed (a VM's
virtio NIC reports -1). ``metrics_bind`` (``--metrics-bind``): the address
``/metrics`` listens on, loopback unless set (``0.0.0.0`` for every
interface). ``node`` is required, as ``--node`` or here.
"""

from __future__ import annotations

import grp
import math
import os
import re
from dataclasses import dataclass, fields
from typing import Any, Mapping

from laxflow.daemon.core import CoreConfig
from laxflow.metrics_http import DEFAULT_BIND, check_bind
from laxflow.daemon.ports import PortSpec, _port_entry, discover_ports, line_rate_gbps, load_ports_file
from laxflow.errors import UserError, read_json_file
from laxflow.policy.config import MfsConfig
from laxflow.protocol.hooks import default_hooks_address, runtime_dir

DEFAULT_SHM = "/laxflow"
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class DaemonConfig:
    """Everything one daemon process needs.

    ``coordinator``: ROUTER address of the coordinator, None to schedule
    locally. ``hooks``: the hooks server's ``ipc://`` address.
    ``metrics_port``: Prometheus HTTP port, None for none (0 picks a free
    one). ``stale_ms``: heartbeat age after which shims pass traffic through
    (the daemon beats four times per period). ``poll_us``: the longest the
    idle loop waits while a hooks permit wait may time out, and its nap
    when the doorbell could not be created (otherwise it blocks until an
    input or a timer). ``spin_us``: how long the loop spins (yielding) after it last
    moved something before it sleeps: a dedicated core answers the next
    event in microseconds; 0 for daemons that share few cores (the testbed's
    four hosts on one machine), where spinning takes CPU from the job.
    ``group``: Unix group (name, or numeric gid) the segment, doorbell and
    hooks sockets are shared with (mode 0660); None keeps them 0600 (the
    daemon's user only).
    """

    node: str
    core: CoreConfig
    shm: str = DEFAULT_SHM
    coordinator: str | None = None
    hooks: str = ""
    metrics_port: int | None = None
    metrics_bind: str = DEFAULT_BIND
    keys_dir: str | None = None
    stale_ms: int = 100
    poll_us: int = 50
    spin_us: int = 2000
    heartbeat_s: float = 0.5
    counter_interval_s: float = 0.001
    group: str | int | None = None

    def __post_init__(self) -> None:
        if not _NODE_RE.match(self.node or ""):
            raise UserError(f"--node: expected 1-64 letters, digits, '_', '.', '-' (got {self.node!r})")
        if not self.shm.startswith("/") or "/" in self.shm[1:] or len(self.shm) > 255:
            raise UserError(f"--shm: expected '/name' (one slash, at most 255 chars), got {self.shm!r}")
        if not self.hooks.startswith("ipc://") or len(self.hooks) <= len("ipc://"):
            raise UserError(f"hooks: expected ipc://PATH, got {self.hooks!r}")
        if self.coordinator is not None and not self.coordinator.startswith(("tcp://", "ipc://")):
            raise UserError(f"--coordinator: expected tcp://HOST:PORT or ipc://PATH, got {self.coordinator!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise UserError(f"--metrics-port: expected 0..65535, got {self.metrics_port}")
        check_bind(self.metrics_bind, "--metrics-bind (config metrics_bind)")
        if not 1 <= self.stale_ms <= 3_600_000:
            raise UserError(f"stale_ms: expected 1..3600000, got {self.stale_ms}")
        if not 1 <= self.poll_us <= 1_000_000:
            raise UserError(f"poll_us: expected 1..1000000, got {self.poll_us}")
        if not 0 <= self.spin_us <= 1_000_000:
            raise UserError(f"spin_us: expected 0..1000000, got {self.spin_us}")
        if not (math.isfinite(self.heartbeat_s) and 0 < self.heartbeat_s <= 60):
            raise UserError(f"heartbeat_s: expected a number of seconds in (0, 60], got {self.heartbeat_s!r}")
        self.group_id  # validates group: one clear line for a bad one

    @property
    def group_id(self) -> int | None:
        """The gid of ``group`` (looked up by name, or given as a number), None without a group."""
        group = self.group
        if group is None:
            return None
        if isinstance(group, str) and group.isdigit():
            group = int(group)
        if isinstance(group, int) and not isinstance(group, bool):
            if not 0 <= group < 2**32 - 1:
                raise UserError(f"group: expected a gid 0..4294967294, got {group}")
            return group
        if not isinstance(group, str) or not group:
            raise UserError(f"group: expected the name or gid of a Unix group, got {group!r}")
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise UserError(f"group: no such Unix group {group!r} (create it, e.g. groupadd --system {group}, "
                            "and add the serving jobs' users to it; or give its numeric gid)") from None

    @property
    def port_ids(self) -> list[str]:
        """Cluster-wide port ids (``node/device``), as the coordinator knows them."""
        return [f"{self.node}/{p.name}" for p in self.core.ports]


_FILE_KEYS = {"node", "coordinator", "shm", "ports", "line_rate_gbps", "metrics_port", "metrics_bind", "hooks",
              "keys_dir", "stale_ms", "poll_us", "spin_us", "rtt_us", "window_bytes", "spare_share", "heartbeat_s",
              "mfs", "default_port", "group", "message_ttl_s"}


def load_config(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> DaemonConfig:
    """Merge ``--config FILE``, the environment and the flags (non-None wins) into one validated config."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    if flags.get("config"):
        raw = read_json_file(flags["config"], "daemon config")
        if not isinstance(raw, dict):
            raise UserError(f"{flags['config']}: daemon config: expected a JSON object")
        unknown = sorted(set(raw) - _FILE_KEYS)
        if unknown:
            raise UserError(f"{flags['config']}: daemon config: unknown key {unknown[0]!r} "
                            f"(expected one of {', '.join(sorted(_FILE_KEYS))})")
        values.update(raw)
    values.update({k: v for k, v in flags.items() if v is not None and k != "config"})
    if "node" not in values:
        raise UserError("--node: required (the name of this node in the cluster), or 'node' in the --config file")
    shm = values.get("shm") or env.get("LAXFLOW_SHM_NAME") or DEFAULT_SHM
    ports = _ports(values.get("ports", "auto"), values.get("line_rate_gbps"))
    mfs_raw = values.get("mfs", {})
    if not isinstance(mfs_raw, dict):
        raise UserError("daemon config: 'mfs' must be an object of MFS options")
    spare = values.get("spare_share", CoreConfig.spare_share)
    core = CoreConfig(
        ports=ports,
        mfs=MfsConfig.from_mapping(mfs_raw),
        rtt=_number(values.get("rtt_us", 20), "rtt_us") * 1e-6,
        window_bytes=None if values.get("window_bytes") is None else _number(values["window_bytes"], "window_bytes"),
        spare_share=None if spare is None else _number(spare, "spare_share"),
        default_port=_integer(values.get("default_port", 0), "default_port"),
        message_ttl=_number(values.get("message_ttl_s", CoreConfig.message_ttl), "message_ttl_s"),
    )
    kw = {f.name: values[f.name] for f in fields(DaemonConfig) if f.name in values and f.name not in ("core", "shm")}
    kw.setdefault("hooks", default_hooks_address(shm, runtime_dir(env)))
    for name in ("metrics_port", "stale_ms", "poll_us", "spin_us"):
        if name in kw and (isinstance(kw[name], bool) or not isinstance(kw[name], int)):
            raise UserError(f"{name}: expected an integer, got {kw[name]!r}")
    return DaemonConfig(core=core, shm=shm, **kw)


def _ports(value: Any, line_rate: Any = None) -> tuple[PortSpec, ...]:
    if value == "auto":
        return discover_ports(line_rate=None if line_rate is None else line_rate_gbps(line_rate))
    if line_rate is not None:
        raise UserError(f"--line-rate (config line_rate_gbps): only with --ports auto (the ports given, {value!r}, "
                        "state their own rates)")
    if isinstance(value, str):
        return load_ports_file(value)
    if isinstance(value, list) and value:
        return tuple(_port_entry(e, f"daemon config: ports[{i}]") for i, e in enumerate(value))
    raise UserError(f"--ports: expected 'auto', a ports file or a list of ports, got {value!r}")


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{what}: expected an integer, got {value!r}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{what}: expected a number, got {value!r}")
    return float(value)


__all__ = ["DaemonConfig", "default_hooks_address", "load_config", "runtime_dir"]
