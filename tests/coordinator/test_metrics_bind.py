"""The coordinator's /metrics listens on its control address or loopback by default, not on every interface."""

from __future__ import annotations

import subprocess

import pytest
from cptest import LAXFLOW, CoordinatorProcess

from laxflow.coordinator.server import ServerConfig
from laxflow.errors import UserError


def listening(port: int) -> set[str]:
    """IPv4 addresses a TCP socket listens on at ``port`` (/proc/net/tcp)."""
    found = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        cols = line.split()
        addr, p = cols[1].split(":")
        if cols[3] == "0A" and int(p, 16) == port:
            found.add(".".join(str(b) for b in bytes.fromhex(addr)[::-1]))
    return found


@pytest.mark.parametrize("bind, metrics_bind, want", [
    ("tcp://0.0.0.0:5555", None, "127.0.0.1"),  # a wildcard control address does not expose the metrics
    ("tcp://*:5555", None, "127.0.0.1"),
    ("tcp://[::]:5555", None, "127.0.0.1"),
    ("tcp://10.1.2.3:5555", None, "10.1.2.3"),  # the control address
    ("tcp://head.example:5555", None, "127.0.0.1"),
    ("ipc:///tmp/c.sock", None, "127.0.0.1"),
    ("tcp://0.0.0.0:5555", "0.0.0.0", "0.0.0.0"),
])
def test_metrics_address(bind, metrics_bind, want):
    assert ServerConfig(bind=bind, insecure=True, metrics_bind=metrics_bind).metrics_address == want


def test_bad_metrics_bind_is_one_line():
    with pytest.raises(UserError, match="--metrics-bind"):
        ServerConfig(bind="tcp://127.0.0.1:5555", metrics_bind="tcp://0.0.0.0").check()
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", "tcp://127.0.0.1:1", "--metrics-port", "0",
                          "--metrics-bind", "0.0.0.0:9470"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--metrics-bind" in out.stderr, out.stderr


@pytest.mark.parametrize("extra, want", [([], "127.0.0.1"), (["--metrics-bind", "0.0.0.0"], "0.0.0.0")])
def test_a_coordinator_on_every_interface_serves_metrics_on_loopback_unless_told(tmp_path, extra, want):
    c = CoordinatorProcess(tmp_path)
    c.args[c.args.index("--bind") + 1] = f"tcp://0.0.0.0:{c.port}"
    c.args += ["--insecure", *extra]
    c.start()
    try:
        assert listening(c.metrics_port) == {want}
        assert c.metrics()["laxflow_coordinator_decisions_total"] == 0  # scraped on 127.0.0.1 either way
    finally:
        c.stop()
