"""Fixtures of the shared-memory protocol tests: segments and C producers."""

from __future__ import annotations

from pathlib import Path

import pytest
from shmtest import C_DIR, NATIVE, gcc, unique_name

from laxflow.protocol.shm import Segment


@pytest.fixture(scope="session")
def ring_producer(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("protocol")
    return gcc(d / "ring_producer", "-O2", "-std=gnu11", "-Wall", f"-I{NATIVE}",
               str(C_DIR / "ring_producer.c"), str(NATIVE / "shm.c"), "-pthread", "-lrt")


@pytest.fixture
def segment():
    name = unique_name()
    Segment.unlink_name(name)
    seg = Segment.create(name)
    yield seg
    seg.close()
