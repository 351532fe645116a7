"""cffi builder of ``laxflow.protocol._shm``, the Python access to the shared memory.

Called by setup.py (``cffi_modules``) during ``pip install``.  The cdef is not
written here: it is the section of ``native/laxflow_shm.h`` between the
``LAXFLOW_CDEF_BEGIN`` and ``LAXFLOW_CDEF_END`` markers, so the header stays
the single source of truth of the layout.  The module compiles
``native/shm.c``, the same ring, permit and tag code the shim runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parents[3]
NATIVE = ROOT / "native"
HEADER = NATIVE / "laxflow_shm.h"
BEGIN = "/* LAXFLOW_CDEF_BEGIN */"
END = "/* LAXFLOW_CDEF_END */"


def extract_cdef(header_text: str) -> str:
    """Return the cffi-parsable section of the layout header."""
    try:
        start = header_text.index(BEGIN) + len(BEGIN)
        stop = header_text.index(END, start)
    except ValueError:
        raise ValueError(f"{HEADER}: expected the markers {BEGIN!r} and {END!r}") from None
    return header_text[start:stop]


def _rel(path: Path) -> str:
    # setuptools wants sources relative to the project root when it can.
    try:
        return os.path.relpath(path, os.getcwd())
    except ValueError:
        return str(path)


ffibuilder = FFI()
ffibuilder.cdef(extract_cdef(HEADER.read_text()))
ffibuilder.set_source(
    "laxflow.protocol._shm",
    '#include "laxflow_shm.h"\n',
    sources=[_rel(NATIVE / "shm.c")],
    include_dirs=[_rel(NATIVE)],
    extra_compile_args=["-std=gnu11", "-O2"],
    libraries=["rt"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
