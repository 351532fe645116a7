"""Helpers of the shared-memory protocol tests."""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
C_DIR = Path(__file__).parent / "c"
_names = itertools.count()


def gcc(out: Path, *args: str) -> Path:
    proc = subprocess.run(["gcc", *args, "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"gcc {' '.join(args)} failed:\n{proc.stderr}")
    return out


def unique_name() -> str:
    return f"/lxf-ptest-{os.getpid()}-{next(_names)}"
