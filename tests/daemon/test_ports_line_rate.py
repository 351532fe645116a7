"""First-hour operator errors of ``laxflow daemon``: ``--ports auto`` on a VM whose NIC reports no speed
(``--line-rate``), ``--node`` required (help and error agree), and ``/metrics`` on loopback by default
(``--metrics-bind``)."""

from __future__ import annotations

import json
import subprocess

import pytest
from daemontest import LAXFLOW

from laxflow.daemon.config import load_config
from laxflow.daemon.ports import discover_ports, line_rate_gbps
from laxflow.errors import UserError

ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
"""


def _virtio_vm(root):
    """sysfs of a VM: virtio eth0 reports speed -1, ifb0 refuses to say (no speed file), lo."""
    for name, speed in (("lo", None), ("eth0", "-1"), ("ifb0", None), ("docker0", "unknown")):
        (root / name / "statistics").mkdir(parents=True)
        (root / name / "statistics" / "tx_bytes").write_text("0\n")
        if speed is not None:
            (root / name / "speed").write_text(speed + "\n")
    return root


def test_auto_without_a_speed_names_every_interface_seen(tmp_path):
    with pytest.raises(UserError) as err:
        discover_ports(_virtio_vm(tmp_path / "net"))
    msg = str(err.value)
    assert "eth0 (speed -1)" in msg and "docker0 (speed 'unknown')" in msg and "ifb0 (speed unreadable" in msg
    assert "lo (" not in msg and "--line-rate GBPS" in msg and "--ports FILE" in msg


def test_line_rate_is_the_default_route_ports_rate(tmp_path):
    root = _virtio_vm(tmp_path / "net")
    route = tmp_path / "route"
    route.write_text(ROUTE)
    (port,) = discover_ports(root, line_rate=25.0, route=route)
    assert (port.name, port.rate, port.counter) == ("eth0", 25e9 / 8, str(root / "eth0/statistics/tx_bytes"))
    (port,) = discover_ports(root, line_rate=2.5, route=tmp_path / "no-route")
    assert (port.name, port.rate, port.counter) == ("default", 2.5e9 / 8, None)
    # a NIC that reports its speed wins over --line-rate
    (root / "eth0" / "speed").write_text("100000\n")
    assert [(p.name, p.rate) for p in discover_ports(root, line_rate=25.0, route=route)] == [("eth0", 100e9 / 8)]


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "nan", "inf", "", 0, -3.5, True, None, [25]])
def test_bad_line_rate_is_one_clear_error(bad):
    with pytest.raises(UserError, match=r"^--line-rate \(config line_rate_gbps\): expected a number of Gbit/s > 0"):
        line_rate_gbps(bad)


def test_line_rate_in_the_config(tmp_path):
    assert line_rate_gbps("2.5") == 2.5 and line_rate_gbps(40) == 40.0
    ports = tmp_path / "ports.json"
    ports.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 100}]}))
    with pytest.raises(UserError, match=r"--line-rate \(config line_rate_gbps\): only with --ports auto"):
        load_config({"node": "n", "ports": str(ports), "line_rate_gbps": "25"})
    cfg = tmp_path / "daemon.json"
    cfg.write_text(json.dumps({"node": "n", "ports": "auto", "line_rate_gbps": -1}))
    with pytest.raises(UserError, match="line_rate_gbps"):
        load_config({"config": str(cfg)})


def _daemon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LAXFLOW, "daemon", *args], capture_output=True, text=True, timeout=60)


def test_node_is_required_and_the_help_says_so(tmp_path):
    help_text = " ".join(_daemon("--help").stdout.replace("│", " ").split())  # unwrapped, box drawing gone
    assert "Required, unless the --config file gives 'node'" in help_text
    out = _daemon("--ports", "auto", "--line-rate", "10")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--node: required" in out.stderr and "'node' in the --config file" in out.stderr
    cfg = tmp_path / "daemon.json"
    cfg.write_text(json.dumps({"node": "n1", "ports": "auto", "line_rate_gbps": "fast"}))
    out = _daemon("--config", str(cfg))  # node from the file: the next error is the line rate's
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--node" not in out.stderr, out.stderr
    assert "line_rate_gbps" in out.stderr and "'fast'" in out.stderr


def test_bad_metrics_bind_is_one_line():
    out = _daemon("--node", "n1", "--ports", "auto", "--line-rate", "10", "--metrics-port", "0",
                  "--metrics-bind", "http://0.0.0.0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--metrics-bind (config metrics_bind)" in out.stderr


def listening(port: int) -> set[str]:
    """Local addresses a TCP socket listens on at ``port`` (/proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                raw = bytes.fromhex(addr)
                if len(raw) == 4:
                    found.add(".".join(str(b) for b in raw[::-1]))
                else:
                    found.add("::" if raw == bytes(16) else addr)
    return found


def test_metrics_listen_on_loopback_unless_told(start_daemon):
    d = start_daemon()
    assert listening(d.metrics_port) == {"127.0.0.1"}
    assert "laxflow_daemon_mode" in d.metrics()
    d = start_daemon(node="n2", extra=["--metrics-bind", "0.0.0.0"])
    assert listening(d.metrics_port) == {"0.0.0.0"}
    d = start_daemon(node="n3", config={"metrics_bind": "0.0.0.0"})
    assert listening(d.metrics_port) == {"0.0.0.0"}
