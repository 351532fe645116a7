"""Network namespaces as hosts, a bridge as the switch, DSCP strict priority.

Layout for ``name`` and N hosts (every object lives inside a namespace this
module creates, so deleting the namespaces removes everything)::

    <name>-h0 .. <name>-h{N-1}   host namespaces, eth0 = 10.77.0.<i+1>/24
    <name>-sw                    switch namespace: bridge br0, port p<i> per host

Queues. On every switch egress port ``p<i>`` and on every host's ``eth0``
sits the same HTB tree at the line rate: one leaf per traffic class (TC 0..7),
HTB ``prio`` 7 - TC so a higher TC is always offered spare bandwidth first,
and a tiny guaranteed rate so that, under contention, a higher class takes
essentially all of the link (strict priority; this kernel has no prio/ets
qdisc). u32 filters map each DSCP of laxflow's :class:`DscpMap` (levels,
scavenger, CNP 48, lossless 26) to its TC; anything else (DSCP 0, ARP) goes
to TC 0, as on a switch that trusts DSCP with a default map.

Why the host egress is shaped too: a real NIC cannot send faster than its
link. Without shaping, a veth sends at memory speed, so one host could push
several times the line rate into the switch and the "fabric" would have no
line rate at all. Shaped at the line rate, each host injects at most what its
link carries, and contention between hosts forms at the switch egress port
toward the common receiver, which is the bottleneck the test measures. The
host tree has the same per-TC strict priority, as a NIC with ``trust dscp``
and strict ETS TCs has, so two classes leaving one host keep their order at
the host too.

State: ``/run/laxflow/testbed/<name>.json`` is written *before* anything is
created, so ``down`` after a crash (even one in the middle of ``up``) knows
the prefix; ``down`` also finds the namespaces by their exact names when the
state file is gone. ``down`` kills processes left inside the namespaces (only
processes in namespaces this testbed created), deletes the namespaces, and is
idempotent.

Callers: ``laxflow testbed up|down`` (:mod:`laxflow.testbed.cli`), the tests
and :mod:`laxflow.testbed.scenario`, all in the main thread of a root process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from laxflow.errors import UserError, user_errors
from laxflow.policy.dscp import CNP_DSCP, LOSSLESS_DSCP, DscpMap, default_dscp_map

STATE_DIR = Path("/run/laxflow/testbed")
SUBNET = "10.77.0"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_UNIT = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
TRAFFIC_CLASSES = range(8)


def parse_rate(text: str) -> int:
    """``"1gbit"`` -> 1_000_000_000 bits/s; the tc spelling, 1 Mbit/s .. 100 Gbit/s."""
    match = _RATE_RE.match(text.strip().lower())
    if not match:
        raise UserError(f"--rate: expected a rate like 100mbit or 1gbit, got {text!r}")
    bps = int(float(match.group(1)) * _UNIT[match.group(2)])
    if not 10**6 <= bps <= 100 * 10**9:
        raise UserError(f"--rate: {text} is outside 1mbit..100gbit")
    return bps


def require_root(what: str) -> None:
    """Refuse clearly: namespaces and qdiscs need CAP_NET_ADMIN."""
    if os.geteuid() != 0:
        raise UserError(f"testbed {what}: needs root (it creates network namespaces and qdiscs); run it as root")


def tc_of_dscp(dscp_map: DscpMap) -> dict[int, int]:
    """DSCP -> switch traffic class, from laxflow's map (levels, scavenger, reserved)."""
    out = {int(row["dscp"]): int(row["tc"]) for row in dscp_map.rows()}
    out.setdefault(CNP_DSCP, 6)
    out.setdefault(LOSSLESS_DSCP, 3)
    return out


@dataclass(frozen=True)
class FabricConfig:
    """What ``laxflow testbed up`` builds; validated once here."""

    hosts: int = 4
    rate: str = "1gbit"
    name: str = "lxftb"
    levels: int = 8  # RMLQ levels of the DSCP map the switch is configured from
    queue_packets: int = 1000  # pfifo limit of each TC queue

    def __post_init__(self) -> None:
        if not 2 <= self.hosts <= 64:
            raise UserError(f"--hosts: expected 2..64, got {self.hosts}")
        if not _NAME_RE.match(self.name):
            raise UserError(f"--name: expected 1-12 lowercase letters/digits starting with a letter, got {self.name!r}")
        parse_rate(self.rate)
        with user_errors("levels"):
            default_dscp_map(self.levels)
        if not 10 <= self.queue_packets <= 100_000:
            raise UserError(f"queue_packets: expected 10..100000, got {self.queue_packets}")

    @property
    def rate_bps(self) -> int:
        return parse_rate(self.rate)

    @property
    def switch_ns(self) -> str:
        return f"{self.name}-sw"

    def host_ns(self, index: int) -> str:
        return f"{self.name}-h{index}"

    def namespaces(self) -> list[str]:
        return [self.switch_ns] + [self.host_ns(i) for i in range(self.hosts)]


def priority_tree(dev: str, rate_bps: int, dscp_map: DscpMap, queue_packets: int) -> list[str]:
    """``tc -batch`` lines: an HTB strict-priority tree on ``dev`` at ``rate_bps``.

    Leaf ``1:1<tc>`` per traffic class; DSCPs outside the map fall to TC 0
    (``default 10``). The guaranteed rate of a leaf is 1/1000 of the link
    (at least 8 kbit/s): small enough that the class order decides who gets
    the link, non-zero because HTB requires a rate.
    """
    floor = max(8000, rate_bps // 1000)
    burst = max(15000, rate_bps // 8 // 1000)  # ~1 ms at the line rate, at least 10 MTUs
    lines = [
        f"qdisc replace dev {dev} root handle 1: htb default 10",
        f"class add dev {dev} parent 1: classid 1:1 htb rate {rate_bps}bit ceil {rate_bps}bit burst {burst} cburst {burst}",
    ]
    for tc in TRAFFIC_CLASSES:
        lines.append(
            f"class add dev {dev} parent 1:1 classid 1:1{tc} htb rate {floor}bit ceil {rate_bps}bit "
            f"burst {burst} cburst {burst} prio {7 - tc} quantum 1514"
        )
        lines.append(f"qdisc add dev {dev} parent 1:1{tc} handle {10 + tc}: pfifo limit {queue_packets}")
    for dscp, tc in sorted(tc_of_dscp(dscp_map).items()):
        lines.append(
            f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dsfield {dscp << 2:#04x} 0xfc flowid 1:1{tc}"
        )
    return lines


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an iproute2 command; a failure is one UserError line naming the command and the kernel's answer."""
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError(f"testbed: {argv[0]!r} not found (install iproute2)") from None
    if check and proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UserError(f"testbed: {' '.join(argv[:4])} failed: {why[0] if why else proc.returncode}")
    return proc


def existing_namespaces() -> set[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _ours(name: str, namespaces: set[str]) -> list[str]:
    pattern = re.compile(rf"^{re.escape(name)}-(sw|h\d+)$")
    return sorted(ns for ns in namespaces if pattern.match(ns))


@dataclass
class Testbed:
    """A running emulated fabric; ``with Testbed(cfg) as tb:`` brings it up and down."""

    __test__ = False  # not a pytest test class despite the name

    config: FabricConfig = field(default_factory=FabricConfig)
    dscp_map: DscpMap | None = None

    def __post_init__(self) -> None:
        if self.dscp_map is None:
            self.dscp_map = default_dscp_map(self.config.levels)

    # -- lifecycle ---------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return STATE_DIR / f"{self.config.name}.json"

    def up(self) -> "Testbed":
        """Create the namespaces, links, addresses and queues; raise if the name is taken."""
        require_root("up")
        cfg = self.config
        taken = _ours(cfg.name, existing_namespaces())
        if taken:
            raise UserError(f"testbed {cfg.name!r} already exists ({', '.join(taken)}); run `laxflow testbed down --name {cfg.name}`")
        self._write_state(complete=False)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._write_state(complete=True)
        return self

    def _build(self) -> None:
        cfg, sw = self.config, self.config.switch_ns
        for ns in cfg.namespaces():
            _run(["ip", "netns", "add", ns])
        ip_sw = ["link add br0 type bridge", "link set br0 up", "link set lo up"]
        for i in range(cfg.hosts):
            host = cfg.host_ns(i)
            # Both ends are created inside namespaces: nothing appears in the root namespace.
            ip_sw.append(f"link add p{i} type veth peer name eth0 netns {host}")
            ip_sw += [f"link set p{i} master br0", f"link set p{i} up"]
        _run(["ip", "-n", sw, "-batch", "-"], "\n".join(ip_sw) + "\n")
        for i in range(cfg.hosts):
            host = cfg.host_ns(i)
            lines = ["link set lo up", f"addr add {self.address(i)}/24 dev eth0", "link set eth0 up"]
            _run(["ip", "-n", host, "-batch", "-"], "\n".join(lines) + "\n")
        for ns in cfg.namespaces():
            # No IPv6: its router solicitations and DAD would only add noise to captures.
            _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"], check=False)
        assert self.dscp_map is not None
        tree = []
        for i in range(cfg.hosts):
            tree += priority_tree(f"p{i}", cfg.rate_bps, self.dscp_map, cfg.queue_packets)
        _run(["tc", "-n", sw, "-batch", "-"], "\n".join(tree) + "\n")
        for i in range(cfg.hosts):
            lines = priority_tree("eth0", cfg.rate_bps, self.dscp_map, cfg.queue_packets)
            _run(["tc", "-n", cfg.host_ns(i), "-batch", "-"], "\n".join(lines) + "\n")

    def down(self) -> list[str]:
        """Remove this testbed's namespaces (and their processes) and state; returns what was removed."""
        return teardown(self.config.name)

    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def _write_state(self, complete: bool) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"config": asdict(self.config), "namespaces": self.config.namespaces(), "pid": os.getpid(),
                 "created": time.time(), "complete": complete}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_path)

    # -- use ---------------------------------------------------------------
    def address(self, host: int) -> str:
        """IPv4 address of host ``host`` (inside its namespace only)."""
        return f"{SUBNET}.{host + 1}"

    def netns(self, host: int | str) -> str:
        """Namespace of host index ``host``, or ``"sw"`` for the switch."""
        if host == "sw":
            return self.config.switch_ns
        if not isinstance(host, int) or not 0 <= host < self.config.hosts:
            raise ValueError(f"host: expected 0..{self.config.hosts - 1} or 'sw', got {host!r}")
        return self.config.host_ns(host)

    def switch_port(self, host: int) -> str:
        """The switch interface whose egress leads to ``host``."""
        return f"p{host}"

    def exec_in(self, host: int | str, argv: Sequence[str], check: bool = False, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in a host's (or the switch's) namespace to completion."""
        kw.setdefault("capture_output", True)
        return subprocess.run(["ip", "netns", "exec", self.netns(host), *argv], text=True, check=check, **kw)

    def popen_in(self, host: int | str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
        """Start ``argv`` in a namespace; the caller waits for it (``down`` kills leftovers)."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns(host), *argv], text=True, **kw)

    def tcp_congestion_control(self, host: int | str = 0) -> str | None:
        """The TCP congestion control a host's sockets get (``net.ipv4.tcp_congestion_control``
        in its namespace, which a new namespace takes from the host's default); None if unreadable."""
        proc = self.exec_in(host, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
        if proc.returncode != 0:
            return None
        return proc.stdout.strip() or None

    def class_packets(self, host: int | str, dev: str) -> dict[int, int]:
        """Packets sent by each TC leaf of the tree on ``dev`` (``tc -s class show``)."""
        out = _run(["tc", "-n", self.netns(host), "-s", "class", "show", "dev", dev]).stdout
        counts: dict[int, int] = {}
        current: int | None = None
        for line in out.splitlines():
            head = re.match(r"class htb 1:1([0-7]) ", line)
            if head:
                current = int(head.group(1))
                continue
            sent = re.match(r"\s*Sent (\d+) bytes (\d+) pkt", line)
            if sent and current is not None:
                counts[current] = int(sent.group(2))
                current = None
        return counts


def teardown(name: str) -> list[str]:
    """Kill processes inside ``name``'s namespaces, delete them and the state file (idempotent)."""
    require_root("down")
    if not _NAME_RE.match(name):
        raise UserError(f"--name: expected 1-12 lowercase letters/digits starting with a letter, got {name!r}")
    found = set(_ours(name, existing_namespaces()))
    state_path = STATE_DIR / f"{name}.json"
    try:
        recorded = json.loads(state_path.read_text()).get("namespaces", [])
        found |= {ns for ns in recorded if ns in existing_namespaces()}
    except (OSError, ValueError):
        pass
    removed = []
    for ns in sorted(found):
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
    for path in (state_path, state_path.with_suffix(".tmp")):
        path.unlink(missing_ok=True)
    return removed


def list_testbeds() -> list[dict[str, Any]]:
    """Recorded testbeds: name, hosts, rate, complete, namespaces present."""
    if not STATE_DIR.is_dir():
        return []
    present = existing_namespaces()
    out = []
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        cfg = state.get("config", {})
        out.append({"name": cfg.get("name", path.stem), "hosts": cfg.get("hosts"), "rate": cfg.get("rate"),
                    "complete": state.get("complete", False),
                    "namespaces_present": sorted(set(state.get("namespaces", [])) & present)})
    return out
