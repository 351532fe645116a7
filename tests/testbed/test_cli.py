"""What a non-root user sees: one clear line for every kernel-touching command; switch-config still works."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from laxflow.cli import app
from laxflow.errors import UserError


@pytest.mark.parametrize("args", [
    ["up", "--name", "lxfnoroot"], ["down", "--name", "lxfnoroot"], ["run", "--scenario", "contention"],
    ["verify-dscp", "--iface", "lo", "--seconds", "1"], ["verify-dscp", "--iface", "p0", "--netns", "x-sw"],
])
def test_refuses_without_root(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(app, ["testbed", *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError) and "needs root" in str(result.exception), result.exception


def test_switch_config_needs_no_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(app, ["testbed", "switch-config", "--vendor", "sonic"])
    assert result.exit_code == 0 and "DSCP_TO_TC_MAP" in result.output
