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



@pytest.fixture(scope="session")
def native_bin(tmp_path_factory):
    """The fake libibverbs and the verbs client of tests/native, built once."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "native"))
    from shimtest import C_DIR, NativeBin, gcc

    d = tmp_path_factory.mktemp("native-daemon")
    fakelib = d / "fakelib"
    fakelib.mkdir()
    gcc(fakelib / "libibverbs.so.1", "-O1", "-g", "-Wall", "-fPIC", "-shared", "-pthread",
        "-Wl,-soname,libibverbs.so.1", f"-Wl,--version-script={C_DIR / 'fake_verbs.map'}", str(C_DIR / "fake_verbs.c"))
    client = gcc(d / "verbs_client", "-O1", "-g", "-Wall", "-no-pie", str(C_DIR / "verbs_client.c"),
                 "-libverbs", "-ldl", "-pthread")
    return NativeBin(fakelib, client)
