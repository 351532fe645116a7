"""The systemd units in deploy/ start: systemd's own checker accepts them without a warning, and the command
line systemd builds from each unit's ExecStart and Environment= parses with the real ``laxflow`` CLI.

This machine has no systemd as PID 1 (no unit can be started), so none is started here; ``systemd-analyze verify`` loads each unit
the way systemd does (the ExecStart binary pointed at this checkout's ``laxflow``, since /opt/laxflow is not
installed here) and reports every assignment it had to ignore.
"""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from laxflow.cli import app

DEPLOY = Path(__file__).parents[1] / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
INSTALLED = "/opt/laxflow/.venv/bin/laxflow"


def test_there_are_units():
    assert {u.name for u in UNITS} >= {"laxflow-daemon.service", "laxflow-coordinator.service"}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_analyze_verify_is_clean(unit, tmp_path):
    here = Path(sys.executable).with_name("laxflow")
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(INSTALLED, str(here)))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True,
                          timeout=60)
    report = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not report, f"systemd-analyze verify {unit.name}:\n{report}"


def _unit_lines(text: str) -> list[tuple[str, str]]:
    """(key, value) of the [Service] section, with backslash continuations joined, as systemd reads them."""
    joined = re.sub(r"\\\n", " ", text)
    out, section = [], None
    for line in joined.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            out.append((key.strip(), value.strip()))
    return out


def _environment(lines: list[tuple[str, str]]) -> dict[str, str]:
    """Environment= as systemd parses it: each value is a list of shell-like words, each word VAR=VALUE."""
    env: dict[str, str] = {}
    for key, value in lines:
        if key == "Environment":
            for word in shlex.split(value):
                assert "=" in word, f"Environment= word {word!r} is not VAR=VALUE (unquoted spaces?)"
                name, val = word.split("=", 1)
                env[name] = val.replace("%H", socket.gethostname())
    return env


def _exec_argv(lines: list[tuple[str, str]], env: dict[str, str]) -> list[str]:
    """ExecStart= expanded as systemd.service(5) says: ${VAR} is one word, $VAR alone is split at white space."""
    (cmd,) = [value for key, value in lines if key == "ExecStart"]
    argv: list[str] = []
    for word in shlex.split(cmd):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            argv.extend(env.get(whole.group(1), "").split())
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_exec_start_parses_with_the_laxflow_cli(unit):
    lines = _unit_lines(unit.read_text())
    argv = _exec_argv(lines, _environment(lines))
    assert argv[0] == INSTALLED
    group = typer.main.get_command(app)
    name = argv[1]
    with group.make_context("laxflow", [name]) as ctx:
        command = group.get_command(ctx, name)
        assert command is not None, f"{unit.name}: no such subcommand {name!r}"
        sub = command.make_context(name, argv[2:], parent=ctx)  # raises on a missing value or an unknown flag
    params = sub.params
    if name == "daemon":
        assert params["node"] and params["coordinator"] == "tcp://head:5555"
        assert params["config"] == "/etc/laxflow/daemon.json"
        # A serving job of another user in group laxflow reaches the segment and the hooks socket (0660) ...
        assert params["group"] == "laxflow" and params["hooks"] == "ipc:///run/laxflow/hooks.sock"
        # ... through /run/laxflow, which the group may enter.
        service = dict(lines)
        mode = int(service["RuntimeDirectoryMode"], 8)
        assert service["RuntimeDirectory"] == "laxflow" and service["Group"] == "laxflow"
        assert mode & 0o050 == 0o050 and mode & 0o007 == 0, oct(mode)
    elif name == "coordinator":
        assert params["metrics_port"] == 9470 and params["bind"] == "tcp://0.0.0.0:5555"
    else:
        pytest.fail(f"{unit.name} starts an unexpected command {name!r}")
