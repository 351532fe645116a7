"""Helpers of the cffi builders (``*_build.py``), run by setup.py during ``pip install``.

Standard library only: a builder loads this file by path (the package is not
importable while it is being built).
"""

from __future__ import annotations

import os
from pathlib import Path


def cdef_of(header: Path) -> str:
    """The cdef of a C API: ``header``'s declarations as they are (cffi drops
    the comments), without its preprocessor lines; its ``#define`` constants
    (not the include guard) as cffi's ``...`` (their values come from the
    compiled header)."""
    lines = []
    for line in header.read_text().splitlines():
        if line.startswith("#define ") and len(line.split()) > 2:
            lines.append(f"#define {line.split()[1]} ...")
        elif not line.startswith("#"):
            lines.append(line)
    return "\n".join(lines)


def rel(path: Path) -> str:
    """``path`` relative to the working directory (setuptools wants sources
    relative to the project root when it can)."""
    try:
        return os.path.relpath(path, os.getcwd())
    except ValueError:
        return str(path)


# Flags of the numeric modules: -ffp-contract=off keeps the compiler from
# fusing a multiply and an add, which would round differently from NumPy and Python.
NUMERIC_FLAGS = ["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-Werror=implicit-function-declaration"]
