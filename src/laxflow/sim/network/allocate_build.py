"""cffi builder of ``laxflow.sim.network._allocate_native``, the C rate allocation.

Called by setup.py (``cffi_modules``) during ``pip install``. The module
compiles ``allocate_native.c`` (next to this file), the same algorithm as
:func:`laxflow.sim.network.allocator.allocate` with the same float operations
in the same order; ``-ffp-contract=off`` keeps the compiler from fusing a
multiply and an add, which would round differently from NumPy.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

CDEF = """
int lxf_allocate(int64_t n, const int64_t *ptr, const int64_t *link, const double *weight, const int64_t *level,
                 const double *cap, const double *capacity, int64_t num_links, int has_from, int64_t from_level,
                 const double *prev_rate, double rel_below, double rel_above, double sat_eps, double *rates);
int lxf_entry_util(int64_t n, const int64_t *ptr, const int64_t *link, const double *weight, const double *rate,
                   const double *capacity, int64_t num_links, double *util);
"""


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
    "#include <stdint.h>\n",
    sources=[_rel(HERE / "allocate_native.c")],
    extra_compile_args=["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
