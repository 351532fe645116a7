"""Fixtures shared by the simulator's tests (this folder is on ``sys.path``, so ``cli_runner`` imports)."""

from __future__ import annotations

from typing import Callable

import pytest
from cli_runner import cli


@pytest.fixture
def laxflow_cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """``laxflow_cli(*args)`` runs the real ``laxflow`` entry point in this process: (exit status, stdout, stderr)."""
    return lambda *args: cli(capsys, *args)
