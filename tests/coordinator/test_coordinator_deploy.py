"""deploy/laxflow-coordinator.service starts the coordinator with flags that exist."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
from pathlib import Path

from cptest import LAXFLOW

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "laxflow-coordinator.service"


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    cp.optionxform = str
    cp.read_string(UNIT.read_text())
    return cp


def test_unit_command_line_parses(tmp_path):
    unit = _unit()
    env = {}
    for line in UNIT.read_text().splitlines():
        if line.startswith("Environment="):  # systemd splits at spaces and honours quotes, as shlex does
            for assignment in shlex.split(line[len("Environment="):]):
                k, v = assignment.split("=", 1)
                env[k] = v
    cmd = unit["Service"]["ExecStart"]
    cmd = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env[m.group(1) or m.group(2)], cmd)
    argv = shlex.split(cmd)
    assert argv[0].endswith("/laxflow") and argv[1] == "coordinator"
    # every flag the unit passes exists; the unit binds off loopback, so it needs the keys it names
    helptext = subprocess.run([LAXFLOW, "coordinator", "--help"], capture_output=True, text=True, timeout=30).stdout
    for flag in (a for a in argv[2:] if a.startswith("--")):
        assert flag in helptext, flag
    assert "--curve-keys" in argv
    missing = tmp_path / "nokeys"
    argv = [LAXFLOW] + argv[1:]
    argv[argv.index("--curve-keys") + 1] = str(missing)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "CURVE key file not found" in out.stderr
    assert unit["Service"]["KillSignal"] == "SIGTERM" and unit["Install"]["WantedBy"] == "multi-user.target"
