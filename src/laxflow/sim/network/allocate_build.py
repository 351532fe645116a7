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

import importlib.util
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


_helpers = importlib.util.spec_from_file_location("laxflow_native_build", HERE.parent.parent / "native_build.py")
native_build = importlib.util.module_from_spec(_helpers)
_helpers.loader.exec_module(native_build)

# table_native.h declares every C function Python calls (allocate_native.c's and table_native.c's).
CDEF = native_build.cdef_of(HERE / "table_native.h")
_rel = native_build.rel


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "laxflow.sim.network._allocate_native",
    '#include <stdint.h>\n#include "table_native.h"\n',
    sources=[_rel(HERE / "allocate_native.c"), _rel(HERE / "table_native.c")],
    include_dirs=[_rel(HERE), _rel(HERE.parents[3] / "native")],  # (native/laxflow_shm.h: the stage codes)
    extra_compile_args=native_build.NUMERIC_FLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
