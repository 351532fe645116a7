"""Build of the native parts; the package metadata lives in pyproject.toml.

``pip install .`` / ``pip install -e .`` run these builds here:
  * the cffi modules (cffi_modules): ``laxflow.protocol._shm``, the Python
    access to the shared-memory layout of ``native/laxflow_shm.h``;
    ``laxflow._stage_codes``, that header's stage codes;
    ``laxflow.sim.network._allocate_native``, the network engine's flow
    table and rate allocation; ``laxflow.policy.mfs._core``, the mfs
    policy's decision step;
  * ``laxflow.policy.mfs._glue`` (ext_modules), a CPython extension: the
    mfs policy's per-flow admission, completion and incremental-decision glue, which
    works on Python objects (see ``src/laxflow/policy/mfs/glue.c``);
  * ``liblaxflow_shim.so`` with ``make -C native``, a plain C library (no
    Python symbols) placed in ``laxflow/_native/`` inside the package, where
    ``laxflow shim-path`` finds it.
All need a C compiler; the shim also needs ``<infiniband/verbs.h>`` from
libibverbs-dev (``make test`` installs it through apt-get when root).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SHIM_NAME = "liblaxflow_shim.so"


class BuildExtWithShim(build_ext):
    """build_ext that also builds the LD_PRELOAD shim next to the extensions."""

    def run(self) -> None:
        super().run()
        self._build_shim()

    def _shim_dir(self) -> Path:
        if self.inplace or getattr(self, "editable_mode", False):
            return ROOT / "src" / "laxflow" / "_native"
        return Path(self.build_lib).resolve() / "laxflow" / "_native"

    def _build_shim(self) -> None:
        out = self._shim_dir()
        out.mkdir(parents=True, exist_ok=True)
        if not Path("/usr/include/infiniband/verbs.h").exists():
            raise SystemExit(
                "building liblaxflow_shim.so needs <infiniband/verbs.h>: "
                "install libibverbs-dev (apt-get install libibverbs-dev)"
            )
        subprocess.check_call(["make", "-C", str(ROOT / "native"), f"OUT={out}"])

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), str(self._shim_dir() / SHIM_NAME)]


# The mfs policy's admission and completion glue: a CPython extension (it
# works on Python objects, which cffi does not reach); see mfs/glue.c.
MFS_GLUE = Extension(
    "laxflow.policy.mfs._glue",
    sources=["src/laxflow/policy/mfs/glue.c"],
    include_dirs=["src/laxflow/policy/mfs"],
    extra_compile_args=["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math",
                        "-Werror=implicit-function-declaration"],
)

setup(
    cmdclass={"build_ext": BuildExtWithShim},
    ext_modules=[MFS_GLUE],
    cffi_modules=[
        "src/laxflow/protocol/shm_build.py:ffibuilder",
        "src/laxflow/stage_build.py:ffibuilder",
        "src/laxflow/sim/network/allocate_build.py:ffibuilder",
        "src/laxflow/policy/mfs/core_build.py:ffibuilder",
    ],
)
