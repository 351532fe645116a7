"""The multi-threaded scenarios again, with the shim, the fake provider and
the programs built under ThreadSanitizer and under AddressSanitizer +
UndefinedBehaviorSanitizer.  Any report fails the test.

The heavy stress lives here: several threads per QP, gates flapping, a
thread reaping completions, releases by the progress thread -- and the event
ring with several C producers and a C consumer in one process, where the
sanitizer sees both sides.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from shimtest import C_DIR, Client, Daemon, NativeBin, client_env, flap_stress, gcc, log_by_qp, run_client, wait_for

ROOT = C_DIR.parents[2]
NATIVE = ROOT / "native"
SANITIZERS = {"thread": "libtsan.so", "address,undefined": "libasan.so"}
OPTIONS = {
    "TSAN_OPTIONS": "halt_on_error=1 exitcode=66 report_signal_unsafe=0",
    # the fake provider and the test programs leak on purpose; leaks are not the point
    "ASAN_OPTIONS": "detect_leaks=0 exitcode=66",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
}


@dataclass(frozen=True)
class SanitizedBuild:
    sanitize: str
    native: NativeBin
    shim: Path
    bench: Path
    runtime: Path  # the sanitizer's runtime, preloaded first as it must be


@pytest.fixture(scope="module", params=list(SANITIZERS))
def build(request, tmp_path_factory) -> SanitizedBuild:
    san = request.param
    runtime = subprocess.run(["gcc", f"-print-file-name={SANITIZERS[san]}"], capture_output=True, text=True,
                             check=True).stdout.strip()
    if not Path(runtime).is_absolute():
        pytest.skip(f"gcc has no {SANITIZERS[san]} (install the gcc sanitizer runtimes: libtsan2, libasan8, libubsan1)")
    d = tmp_path_factory.mktemp("san-" + san.split(",")[0])
    flags = [f"-fsanitize={san}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1", "-g"]
    proc = subprocess.run(["make", "-s", "-C", str(NATIVE), f"OUT={d}", f"SANITIZE={san}", "CFLAGS=-O1 -g"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    fakelib = d / "fakelib"
    fakelib.mkdir()
    gcc(fakelib / "libibverbs.so.1", *flags, "-fPIC", "-shared", "-pthread", "-Wl,-soname,libibverbs.so.1",
        f"-Wl,--version-script={C_DIR / 'fake_verbs.map'}", str(C_DIR / "fake_verbs.c"))
    # -no-pie: SG addresses in the fake log are the same run to run
    client = gcc(d / "verbs_client", *flags, "-no-pie", str(C_DIR / "verbs_client.c"), f"-L{fakelib}", "-libverbs",
                 "-ldl", "-pthread")
    bench = gcc(d / "shim_bench", *flags, "-std=gnu11", f"-I{NATIVE}", str(ROOT / "bench" / "shim_bench.c"),
                str(NATIVE / "shm.c"), f"-L{fakelib}", "-libverbs", "-ldl", "-pthread", "-lrt")
    return SanitizedBuild(san, NativeBin(fakelib, client), d / "liblaxflow_shim.so", bench, Path(runtime))


@pytest.fixture
def daemon():
    d = Daemon()  # sanitized programs are slow: never look like a dead daemon
    yield d
    d.close()


def no_report(stderr: str) -> None:
    for marker in ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer", "runtime error:"):
        assert marker not in stderr, stderr


@pytest.mark.parametrize("mode", ["direct", "ex"])
def test_stress_threads_per_qp_gates_flapping(build, daemon, tmp_path, mode):
    result = flap_stress(build.native, build.shim, daemon, tmp_path, [mode, "2", "120", "3", "--tpq", "3", "--poll"],
                         runtime=build.runtime, **OPTIONS)
    no_report(result.stderr)


def test_event_ring_producers_and_consumer(build, tmp_path):
    """4 C producer threads and the C consumer of one process through the
    event ring (shm.c, as the shim and the daemon run it)."""
    name = f"/lxf-san-ring-{tmp_path.name}"
    seg = Daemon(name=name)
    try:
        env = {"LAXFLOW_SHM_NAME": name, "LD_LIBRARY_PATH": str(build.native.fakelib_dir), **OPTIONS}
        proc = subprocess.run([str(build.bench), "ring", "4", "200000"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        no_report(proc.stderr)
        assert float(proc.stdout) > 0
    finally:
        seg.close()


def test_post_racing_a_daemon_restart(build, tmp_path):
    """The restart race of tests/daemon/test_daemon_shim.py with the sanitizer watching: phase 1's posts are held
    inside their read window (LAXFLOW_TEST_PAUSE_POST) holding the old segment's flow tags while the progress
    thread moves the shim to a new segment; released, they neither reach nor wait on the new segment, and
    phase 2 is gated by the new one."""
    name = f"/lxf-san-restart-{tmp_path.name}"
    gate = tmp_path / "pause-post"
    args = ["direct", "2", "20", "3"]
    ref_log = tmp_path / "reference.log"
    ref = run_client(build.native, args, client_env(build.native, ref_log, runtime=build.runtime, **OPTIONS))
    assert ref.returncode == 0, ref.stderr
    old = Daemon(name=name)
    new = None
    log = tmp_path / "shim.log"
    client = Client(build.native, [*args, "--wait"], client_env(build.native, log, build.shim, name, build.runtime,
                                                                LAXFLOW_TEST_PAUSE_POST=str(gate), **OPTIONS))
    try:
        pid, qps = client.qps()
        plan = client.plan(2, 3)
        for qp in qps:
            old.seg.set_permit(old.seg.tag_qp(pid, qp, 7, 3, 0, bytes=plan[qp, 0]), 1)
        client.send()
        client.expect("POSTED 0", timeout=120)
        old.hang(200_000_000)
        time.sleep(0.4)  # stale: the shim passes through
        gate.touch()
        client.send()
        wait_for(lambda: Path(f"{gate}.waiting").exists(), timeout=60, what="a poster held inside the window")
        old.seg.close()  # the name goes; the shim keeps its mapping
        new = Daemon(name=name)
        wait_for(lambda: new.seg.counters()["reattaches"] >= 1, timeout=60, what="the shim moving to the new segment")
        gate.unlink()
        client.expect("POSTED 1", timeout=120)
        assert new.seg.counters()["wr_deferred"] == 0
        assert not len(new.seg.drain_events())  # no SUBMIT of an old message reached the new daemon
        msgs = [new.seg.tag_qp(pid, qp, 7, 3, 2, bytes=plan[qp, 2]) for qp in qps]
        client.send()
        client.expect("POSTED 2", timeout=120)
        assert new.seg.counters()["wr_deferred"] > 0  # held: no permit yet
        for m in msgs:
            new.seg.set_permit(m, 1)
        rc = client.wait(timeout=180)
        stderr = client.proc.stderr.read()
        assert rc == 0, stderr
        no_report(stderr)
        assert log_by_qp(log) == log_by_qp(ref_log)
    finally:
        gate.unlink(missing_ok=True)
        if client.proc.poll() is None:
            client.proc.kill()
        old.close()
        if new is not None:
            new.close()
