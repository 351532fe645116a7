"""The network engine's C part (``allocate_native.c``, ``table_native.c``)
and the mfs policy's (``mfs/core*.c``, a CPython extension) built under AddressSanitizer +
UndefinedBehaviorSanitizer and driven through whole runs: a fluid run with
three levels, caps, timers and up to dozens of live flows arriving and
finishing, and small serving runs under FS and MFS (which keeps the
link-load average and decides in C). Any sanitizer report fails the test,
and the sanitized build must give the same results as the installed one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from laxflow.sim.network import allocate_build

NETWORK = Path(allocate_build.__file__).resolve().parent  # src/laxflow/sim/network
PACKAGE = NETWORK.parents[1]  # src/laxflow
POLICY = PACKAGE / "policy" / "mfs"
SANITIZE = ["-std=gnu11", "-O1", "-g", "-ffp-contract=off", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all"]

DRIVER = r'''
import hashlib
import numpy as np
from laxflow.policy import Decision, Flow, FlowPolicy, Stage
from laxflow.sim.events import Priority
from laxflow.sim.network import FluidNetwork, leaf_spine
from laxflow.sim.network import _allocate_native
from laxflow.policy.mfs import _core
from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import CAPACITY, RunSpec, build_workload
from laxflow.sim.serving.simulator import ServingSimulator

class Mixed(FlowPolicy):
    name = "test-mixed"
    def decide(self, snap):
        seeds = [f.state["seed"] for f in snap.flows]
        level = np.array([(s + int(snap.now * 1e4)) % 3 for s in seeds], dtype=np.int64)
        cap = np.array([2e8 if s % 5 == 0 else np.inf for s in seeds])
        snap.link_load, snap.remaining, snap.size, snap.bottleneck_rate
        return self.decision(level, cap=cap, timers=(snap.now + 3e-5,) if len(seeds) % 4 == 0 else ())

h = hashlib.sha256()
rng = np.random.default_rng(3)
topo = leaf_spine(64, 8, 1e9, oversubscription=2.0)
net = FluidNetwork(topo, Mixed())
flows, t = [], 0.0
for i in range(600):
    t += float(rng.exponential(1.5e-6))
    src = int(rng.integers(0, 64))
    flow = Flow.on_path(f"f{i}", float(rng.exponential(2e4) + 100), topo.path(src, (src + int(rng.integers(1, 64))) % 64),
                        arrival=t, stage=list(Stage)[i % 3])
    flow.state["seed"] = i
    flows.append(flow)
    net.queue.push(flow.arrival, Priority.ARRIVAL, net.add_flow, flow)
net.run()
h.update(repr([f.finish.hex() for f in flows]).encode())
h.update(repr(net.link_load.tolist()).encode())
mix = ("mixtral-8x22b", "qwen-conv")
for policy in ("fs", "mfs"):
    cfg = ServingConfig(model=mix[0], cluster=ClusterConfig(servers=16), warmup=20)
    reqs = build_workload(RunSpec(cfg, mix[1], 0.7 * CAPACITY[mix], policy, 40, seed=0))
    res = ServingSimulator(cfg, reqs, policy).run()
    h.update(repr([(s.ttft.hex(), s.batch) for s in res.measured]).encode())
    h.update(str(res.network_events).encode())
print(_allocate_native.__file__)
print(_core.__file__)
print(h.hexdigest())
'''


def _runtime(name: str) -> str:
    path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    if not Path(path).is_absolute():
        pytest.skip(f"gcc has no {name} (install the gcc sanitizer runtimes: libasan8, libubsan1)")
    return path


def test_engine_native_part_under_asan_and_ubsan(tmp_path):
    from cffi import FFI

    asan, ubsan = _runtime("libasan.so"), _runtime("libubsan.so")
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg / "laxflow", ignore=shutil.ignore_patterns("_allocate_native*", "_core.*",
                                                                          "__pycache__"))
    modules = [  # (module, cdef, header, sources, where it goes, include dirs)
        ("laxflow.sim.network._allocate_native", allocate_build.CDEF, "table_native.h",
         [NETWORK / "allocate_native.c", NETWORK / "table_native.c"], NETWORK, [NETWORK, PACKAGE.parents[1] / "native"]),
    ]  # fmt: skip
    for name, cdef, header, sources, where, includes in modules:
        ffi = FFI()
        ffi.cdef(cdef)
        ffi.set_source(name, f'#include <stdint.h>\n#include "{header}"\n', sources=[str(x) for x in sources],
                       include_dirs=[str(x) for x in includes], extra_compile_args=SANITIZE, extra_link_args=["-fsanitize=address,undefined"])
        built = ffi.compile(tmpdir=str(tmp_path / "build" / name))
        shutil.copy(built, pkg / where.relative_to(PACKAGE.parent))
    core = pkg / POLICY.relative_to(PACKAGE.parent) / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["gcc", "-shared", "-fPIC", *SANITIZE, f"-I{sysconfig.get_paths()['include']}",
                    f"-I{PACKAGE.parents[1] / 'native'}", f"-I{POLICY}",
                    *(str(POLICY / name) for name in ("core.c", "core_tables.c", "core_step.c")), "-o", str(core),
                    "-fsanitize=address,undefined"], check=True)

    plain = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(pkg), "LD_PRELOAD": f"{asan}:{ubsan}",
           "ASAN_OPTIONS": "detect_leaks=0 exitcode=66", "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1"}
    sanitized = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, timeout=600)
    assert sanitized.returncode == 0, sanitized.stderr[-3000:]
    assert "runtime error" not in sanitized.stderr and "Sanitizer" not in sanitized.stderr, sanitized.stderr[-3000:]
    *modules_run, digest = sanitized.stdout.split()
    assert all(Path(m).is_relative_to(pkg) for m in modules_run)  # the sanitized builds ran, not the installed ones
    assert digest == plain.stdout.split()[-1]
