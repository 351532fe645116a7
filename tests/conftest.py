"""Fixtures shared by the suite's top-level tests."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Callable

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench_script(monkeypatch) -> Callable[..., object]:
    """``load(name, *also)``: the bench/ script ``name`` as a module, imported afresh with the bench modules
    ``also`` that it imports (bench/ is on sys.path for this test only)."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str, *also: str):
        for mod in (name, *also):
            sys.modules.pop(mod, None)
        return importlib.import_module(name)
    return load
