"""cffi builder of ``laxflow.policy.mfs._core``, the mfs policy's decision step in C.

Called by setup.py (``cffi_modules``) during ``pip install``. The module
compiles ``core.c`` (next to this file): the reference ``MfsPolicy.decide``'s
steps with the same float operations in the same order;
``-ffp-contract=off`` keeps the compiler from fusing a multiply and an add,
which would round differently from NumPy. Without a C compiler the policy
runs its reference (``laxflow.policy.mfs.core.NATIVE`` is False).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


_helpers = importlib.util.spec_from_file_location("laxflow_native_build", HERE.parent.parent / "native_build.py")
native_build = importlib.util.module_from_spec(_helpers)
_helpers.loader.exec_module(native_build)
_rel = native_build.rel
CDEF = native_build.cdef_of(HERE / "core.h")
# core.c's headers: core.h, and native/laxflow_shm.h for the one stage table (LXF_STAGE_*).
INCLUDE_DIRS = [HERE, HERE.parents[3] / "native"]


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "laxflow.policy.mfs._core",
    '#include <stdint.h>\n#include "core.h"\n',
    sources=[_rel(HERE / "core.c")],
    include_dirs=[_rel(d) for d in INCLUDE_DIRS],
    libraries=["m"],
    extra_compile_args=native_build.NUMERIC_FLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
