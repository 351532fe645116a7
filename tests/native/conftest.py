"""Fixtures of the native-shim tests (helpers in shimtest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from shimtest import C_DIR, Daemon, NativeBin, gcc

from laxflow.shim import shim_path


@pytest.fixture(scope="session")
def shim_lib() -> Path:
    return shim_path()


@pytest.fixture(scope="session")
def native_bin(tmp_path_factory) -> NativeBin:
    d = tmp_path_factory.mktemp("native")
    fakelib = d / "fakelib"
    fakelib.mkdir()
    gcc(
        fakelib / "libibverbs.so.1",
        "-O1", "-g", "-Wall", "-fPIC", "-shared", "-pthread",
        "-Wl,-soname,libibverbs.so.1", f"-Wl,--version-script={C_DIR / 'fake_verbs.map'}",
        str(C_DIR / "fake_verbs.c"),
    )
    # -no-pie: the SG addresses in the fake log are the same run to run
    client = gcc(d / "verbs_client", "-O1", "-g", "-Wall", "-no-pie", str(C_DIR / "verbs_client.c"),
                 "-libverbs", "-ldl", "-pthread")
    return NativeBin(fakelib, client)


@pytest.fixture
def daemon():
    # Live until a test says otherwise (Daemon.hang); the default staleness
    # (100 ms) is exercised by the kill test.
    d = Daemon()
    yield d
    d.close()
