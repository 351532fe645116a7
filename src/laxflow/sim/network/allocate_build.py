"""cffi builder of ``laxflow.sim.network._allocate_native``, the C rate allocation.

Called by setup.py (``cffi_modules``) during ``pip install``. The module
compiles ``allocate_native.c`` (next to this file), the same algorithm as
:func:`laxflow.sim.network.allocator.allocate` with the same float operations
in the same order, and ``table_native.c``, the engine's live-flow table
(:class:`~laxflow.sim.network.engine.FluidNetwork` keeps every per-flow
number there); ``-ffp-contract=off`` keeps the compiler from fusing a
multiply and an add, which would round differently from NumPy.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


def _cdef(header: Path) -> str:
    """The cdef of the C API: ``header``'s declarations as they are (cffi drops
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


# table_native.h declares every C function Python calls (allocate_native.c's and table_native.c's).
CDEF = _cdef(HERE / "table_native.h")


def _rel(path: Path) -> str:
    # setuptools wants sources relative to the project root when it can.
    try:
        return os.path.relpath(path, os.getcwd())
    except ValueError:
        return str(path)


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "laxflow.sim.network._allocate_native",
    '#include <stdint.h>\n#include "table_native.h"\n',
    sources=[_rel(HERE / "allocate_native.c"), _rel(HERE / "table_native.c")],
    include_dirs=[_rel(HERE)],
    extra_compile_args=["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-Werror=implicit-function-declaration"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
