"""Build of the native parts; the package metadata lives in pyproject.toml.

``pip install .`` / ``pip install -e .`` run these builds here:
  * the cffi modules (cffi_modules): ``laxflow.protocol._shm``, the Python
    access to the shared-memory layout of ``native/laxflow_shm.h``;
    ``laxflow._stage_codes``, that header's stage codes;
    ``laxflow.sim.network._allocate_native``, the network engine's flow
    table and rate allocation;
  * ``laxflow.policy.mfs._core`` (ext_modules), a CPython extension: the
    mfs policy's state and decision step, which works on the flows, the
    snapshots and their arrays (see ``src/laxflow/policy/mfs/core.c``);
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


# The mfs policy's state and decision step: a CPython extension (it works on
# Python objects, which cffi does not reach); see mfs/core.c. -ffp-contract=off
# keeps the compiler from fusing a multiply and an add, which would round
# differently from the NumPy reference.
MFS_CORE = Extension(
    "laxflow.policy.mfs._core",
    sources=["src/laxflow/policy/mfs/core.c", "src/laxflow/policy/mfs/core_tables.c", "src/laxflow/policy/mfs/core_step.c"],
    include_dirs=["native", "src/laxflow/policy/mfs"],
    extra_compile_args=["-std=gnu11", "-O2", "-ffp-contract=off", "-fno-fast-math",
                        "-Werror=implicit-function-declaration"],
)

setup(
    cmdclass={"build_ext": BuildExtWithShim},
    ext_modules=[MFS_CORE],
    cffi_modules=[
        "src/laxflow/protocol/shm_build.py:ffibuilder",
        "src/laxflow/stage_build.py:ffibuilder",
        "src/laxflow/sim/network/allocate_build.py:ffibuilder",
    ],
)
