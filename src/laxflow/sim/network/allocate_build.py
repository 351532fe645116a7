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

CDEF = """
int lxf_allocate(int64_t n, const int64_t *ptr, const int64_t *link, const double *weight, const int64_t *level,
                 const double *cap, const double *capacity, int64_t num_links, int has_from, int64_t from_level,
                 const double *prev_rate, double rel_below, double rel_above, double sat_eps, double *rates);

#define LXF_BAD_LEVEL ...
#define LXF_BAD_CAP ...
#define LXF_BAD_QUEUE ...
#define LXF_BAD_DSCP ...
struct lxf_table {
    int64_t n;
    double *remaining, *rate, *size, *arrival, *bneck, *cap;
    int64_t *level;
    int8_t *stage;
    int64_t *ptr;
    int64_t *link;
    double *weight;
    double delivered[4];
    double *load;
    int64_t nutil;
    double *util;
    int track;
    ...;
};
struct lxf_table *lxf_table_new(int64_t num_links, const double *capacity, int track, double load_window);
void lxf_table_free(struct lxf_table *t);
int lxf_table_add(struct lxf_table *t, double size, double arrival, int stage, double bneck, int64_t nnz,
                  const int64_t *link, const double *weight);
void lxf_table_advance(struct lxf_table *t, double dt);
int64_t lxf_table_complete(struct lxf_table *t, double now, double rel_eps, double time_eps, int64_t *out,
                           int64_t *low);
void lxf_table_compact(struct lxf_table *t);
double lxf_table_next(const struct lxf_table *t);
void lxf_table_idle(struct lxf_table *t);
void lxf_table_load_clipped(const struct lxf_table *t, double *out);
int lxf_table_decide(struct lxf_table *t, int64_t kept, const int64_t *level, const double *cap,
                     const int64_t *queue, const uint8_t *dscp, int64_t *changed, int64_t *out);
int lxf_table_apply(struct lxf_table *t, int64_t kept, const int64_t *level, const double *cap, const int64_t *queue,
                    const uint8_t *dscp, int64_t *changed, int64_t *out, int native, double rel_below,
                    double rel_above, double sat_eps, double *next);
int lxf_table_allocate(struct lxf_table *t, int64_t from_level, double rel_below, double rel_above, double sat_eps);
int lxf_table_util(struct lxf_table *t);
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
    '#include <stdint.h>\n#include "table_native.h"\n',
    sources=[_rel(HERE / "allocate_native.c"), _rel(HERE / "table_native.c")],
    include_dirs=[_rel(HERE)],
    extra_compile_args=["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-Werror=implicit-function-declaration"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
