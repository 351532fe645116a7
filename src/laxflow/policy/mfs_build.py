"""cffi builder of ``laxflow.policy._mfs_native``, the mfs policy's decision step in C.

Called by setup.py (``cffi_modules``) during ``pip install``. The module
compiles ``mfs_native.c`` (next to this file): the reference ``MfsPolicy.decide``'s
steps with the same float operations in the same order;
``-ffp-contract=off`` keeps the compiler from fusing a multiply and an add,
which would round differently from Python. Without a C compiler the policy
runs its reference (``laxflow.policy.mfs_native.NATIVE`` is False).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


_helpers = importlib.util.spec_from_file_location("laxflow_native_build", HERE.parent / "native_build.py")
native_build = importlib.util.module_from_spec(_helpers)
_helpers.loader.exec_module(native_build)
_rel = native_build.rel
CDEF = native_build.cdef_of(HERE / "mfs_native.h")


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "laxflow.policy._mfs_native",
    '#include <stdint.h>\n#include "mfs_native.h"\n',
    sources=[_rel(HERE / "mfs_native.c")],
    include_dirs=[_rel(HERE)],
    libraries=["m"],
    extra_compile_args=native_build.NUMERIC_FLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
