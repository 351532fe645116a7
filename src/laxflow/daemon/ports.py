"""The node's NIC ports: their line rate, and their measured load.

Port discovery is called once by the daemon's config loader
(:func:`load_ports_file` for ``--ports FILE``, :func:`discover_ports` for
``--ports auto``, :func:`line_rate_gbps` for ``--line-rate``). :class:`LinkMeter` is owned by the daemon core and fed,
on the daemon's loop thread, with byte-counter samples: the NIC's own
``tx_bytes`` when the port has one (sysfs), else the bytes of messages the
core saw complete.

Units: rates in bytes/s, times in seconds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from laxflow.errors import UserError, read_json_file

SYSFS_NET = Path("/sys/class/net")
PROC_ROUTE = Path("/proc/net/route")


@dataclass(frozen=True)
class PortSpec:
    """One NIC port the daemon schedules.

    ``rate``: line rate in bytes/s. ``counter``: a file holding the port's
    cumulative transmitted bytes (``/sys/class/net/IF/statistics/tx_bytes``),
    or None to measure load from completed messages only.
    """

    name: str
    rate: float
    counter: str | None = None
    window: float | None = None  # the permit rule's window on this port, bytes (None: the daemon's)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise UserError(f"port: name must be a non-empty string, got {self.name!r}")
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not math.isfinite(self.rate) or self.rate <= 0:
            raise UserError(f"port {self.name!r}: rate must be a number of bytes/s > 0, got {self.rate!r}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, (int, float))
                                        or math.isnan(self.window) or self.window < 0):
            raise UserError(f"port {self.name!r}: window must be a number of bytes >= 0, got {self.window!r}")


def load_ports_file(path: str | os.PathLike[str]) -> tuple[PortSpec, ...]:
    """``--ports FILE``: JSON ``{"ports": [{"name": "eth0", "gbps": 100}, ...]}``.

    Each port gives ``gbps`` (line rate in Gbit/s) or ``rate`` (bytes/s), and
    optionally ``counter`` (path of a cumulative byte-counter file) and
    ``window`` (bytes: the permit rule's window on this port instead of the
    daemon's one bandwidth-delay product). A port whose queue is not this
    host's -- the receive side, where a remote switch port orders the bytes
    by their DSCP -- takes a window larger than anything in flight
    (e.g. 1e12): its messages are classified, never held. A bad file is one
    UserError naming the file and the field.
    """
    raw = read_json_file(path, "ports file")
    where = str(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("ports"), list) or not raw["ports"]:
        raise UserError(f"{where}: ports file: expected {{\"ports\": [...]}} with at least one port")
    out: list[PortSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw["ports"]):
        out.append(_port_entry(entry, f"{where}: ports[{i}]"))
        if out[-1].name in seen:
            raise UserError(f"{where}: ports[{i}]: duplicate port name {out[-1].name!r}")
        seen.add(out[-1].name)
    return tuple(out)


def _port_entry(entry: Any, where: str) -> PortSpec:
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected an object with 'name' and 'gbps' or 'rate'")
    unknown = set(entry) - {"name", "gbps", "rate", "counter", "window"}
    if unknown:
        raise UserError(f"{where}: unknown field {sorted(unknown)[0]!r} (expected name, gbps, rate, counter, window)")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: 'name' must be a non-empty string")
    if ("gbps" in entry) == ("rate" in entry):
        raise UserError(f"{where}: port {name!r}: give exactly one of 'gbps' and 'rate'")
    value = entry.get("gbps", entry.get("rate"))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{where}: port {name!r}: {'gbps' if 'gbps' in entry else 'rate'} must be a number > 0")
    rate = float(value) * 1e9 / 8 if "gbps" in entry else float(value)
    counter = entry.get("counter")
    if counter is not None and not isinstance(counter, str):
        raise UserError(f"{where}: port {name!r}: 'counter' must be a file path")
    window = entry.get("window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float)) or window < 0):
        raise UserError(f"{where}: port {name!r}: 'window' must be a number of bytes >= 0")
    return PortSpec(name, rate, counter, None if window is None else float(window))


def line_rate_gbps(value: Any) -> float:
    """``--line-rate GBPS`` (config ``line_rate_gbps``) as a number of Gbit/s > 0, else one UserError."""
    try:
        gbps = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else math.nan
    except ValueError:
        gbps = math.nan
    if not (math.isfinite(gbps) and gbps > 0):
        raise UserError(f"--line-rate (config line_rate_gbps): expected a number of Gbit/s > 0, got {value!r}")
    return gbps


def discover_ports(root: Path = SYSFS_NET, line_rate: float | None = None,
                   route: Path = PROC_ROUTE) -> tuple[PortSpec, ...]:
    """``--ports auto``: every interface with a positive ``speed`` (Mbit/s) in sysfs.

    Loopback and interfaces that report no speed (virtio NICs report -1;
    down or virtual ones none) are skipped. With none left and ``line_rate``
    (Gbit/s, ``--line-rate``) given, the node schedules one port at that
    rate: the interface of the default route (``route``, /proc/net/route),
    with its byte counter, or a port named ``default`` when there is none.
    Without it this is a UserError naming every interface seen and the speed
    it reported.
    """
    out, seen = [], []
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        if dev.name == "lo":
            continue
        try:
            raw = (dev / "speed").read_text().strip()
            mbps = int(raw)
        except OSError as exc:
            seen.append(f"{dev.name} (speed unreadable: {exc.strerror or exc})")
            continue
        except ValueError:
            seen.append(f"{dev.name} (speed {raw!r})")
            continue
        if mbps <= 0:
            seen.append(f"{dev.name} (speed {mbps})")
            continue
        counter = dev / "statistics" / "tx_bytes"
        out.append(PortSpec(dev.name, mbps * 1e6 / 8, str(counter) if counter.exists() else None))
    if out:
        return tuple(out)
    if line_rate is not None:
        name = _default_route_interface(route)
        counter = root / name / "statistics" / "tx_bytes" if name else None
        if counter is None or not counter.exists():
            return (PortSpec(name or "default", line_rate * 1e9 / 8),)
        return (PortSpec(name, line_rate * 1e9 / 8, str(counter)),)
    raise UserError(f"--ports auto: no interface under {root} reports a link speed (seen: {', '.join(seen) or 'none'}"
                    "); pass --ports FILE, or --line-rate GBPS (config line_rate_gbps) for one port at that rate")


def _default_route_interface(route: Path) -> str | None:
    """The interface of the IPv4 default route in ``route`` (/proc/net/route format), None without one."""
    try:
        lines = route.read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        cols = line.split()
        if len(cols) > 2 and cols[1] == "00000000" and cols[0] != "lo":
            return cols[0]
    return None


class LinkMeter:
    """Per-port load: an EWMA of utilization from cumulative byte counters.

    Over an interval dt in which a port moved b bytes at capacity C the
    utilization is ``u = b / (C dt)`` (clipped to [0, 1]) and the load
    becomes ``u + (load - u) * exp(-dt / window)`` -- the network engine's
    formula, so samples taken at every rate change reproduce its
    ``link_load`` exactly. ``window`` is the time constant stated in every
    Snapshot the core builds.

    A counter can run ahead of the wire: a NIC (or veth) counts a TSO/GSO
    super-packet, up to 64 KB, when it takes it, not as its frames leave (5 ms
    of a 100 Mbit/s link). The bytes beyond the line rate in one interval are
    carried into the next intervals (at most one window's worth), not
    clipped away: clipped, a saturated link sampled every millisecond read as
    ~0.2 busy on the 100 Mbit/s testbed.
    """

    def __init__(self, capacity: Sequence[float], window: float) -> None:
        if not window > 0:
            raise ValueError(f"load window must be > 0 s, got {window!r}")
        self.capacity = np.asarray(capacity, dtype=float)
        self.window = float(window)
        n = self.capacity.size
        self.load = np.zeros(n)
        self._bytes = np.zeros(n)  # counter value at the last sample
        self._t = np.full(n, np.nan)  # time of the last sample (NaN: none yet)
        self._carry = np.zeros(n)  # bytes counted ahead of the line rate, due in the next intervals

    def sample(self, port: int, total_bytes: float, now: float) -> float | None:
        """The port's cumulative byte counter read at ``now``; the utilization
        of the interval it closes (carried bytes included, in [0, 1]), None if
        it closes none (the first sample, or no time passed)."""
        last_t = self._t[port]
        if math.isnan(last_t):
            self._t[port], self._bytes[port] = now, total_bytes
            return None
        dt = now - last_t
        if dt <= 0:
            return None  # same instant: keep the older base, the bytes count at the next sample
        moved = max(0.0, total_bytes - self._bytes[port]) + self._carry[port]
        span = self.capacity[port] * dt
        u = min(1.0, moved / span)
        self._carry[port] = min(moved - u * span, self.capacity[port] * self.window)
        self.load[port] = u + (self.load[port] - u) * math.exp(-dt / self.window)
        self._t[port], self._bytes[port] = now, total_bytes
        return u

    def last_sample(self, port: int) -> tuple[float, float]:
        """The port's last counter sample the load came from: (time, bytes); time NaN before any."""
        return float(self._t[port]), float(self._bytes[port])

    def loads(self) -> np.ndarray:
        return np.clip(self.load, 0.0, 1.0)
