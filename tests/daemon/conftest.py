"""Fixtures of the daemon tests (helpers in daemontest.py)."""

from __future__ import annotations

import pytest
from daemontest import DaemonProc


@pytest.fixture
def start_daemon(tmp_path):
    started: list[DaemonProc] = []

    def start(**kw) -> DaemonProc:
        d = DaemonProc(tmp_path, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.cleanup()

