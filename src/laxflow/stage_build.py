"""cffi builder of ``laxflow._stage_codes``: the stage codes of ``native/laxflow_shm.h``.

Called by setup.py (``cffi_modules``) during ``pip install``. Nothing is
written here but the names: the cdef is the header's ``#define LXF_STAGE_*``
lines as cffi's ``...`` constants, whose values the compiler takes from the
header itself, so the stage table has one place, the header that the shim,
the daemon's cffi module and this one all compile. :mod:`laxflow.stage`
reads the module.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
_helpers = importlib.util.spec_from_file_location("laxflow_native_build", HERE / "native_build.py")
native_build = importlib.util.module_from_spec(_helpers)
_helpers.loader.exec_module(native_build)

ROOT = HERE.parents[1]
NATIVE = ROOT / "native"
HEADER = NATIVE / "laxflow_shm.h"
STAGE_DEFINE = re.compile(r"^#define (LXF_STAGE_[A-Z0-9_]+)\s", re.MULTILINE)


def stage_names(header_text: str) -> list[str]:
    """The ``LXF_STAGE_*`` constants the header defines, in its order."""
    names = STAGE_DEFINE.findall(header_text)
    if not names:
        raise ValueError(f"{HEADER}: expected '#define LXF_STAGE_<NAME> <code>' lines")
    return names


ffibuilder = FFI()
ffibuilder.cdef("\n".join(f"#define {name} ..." for name in stage_names(HEADER.read_text())))
ffibuilder.set_source(
    "laxflow._stage_codes",
    '#include "laxflow_shm.h"\n',
    include_dirs=[native_build.rel(NATIVE)],
    extra_compile_args=["-std=gnu11"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
