"""Fail open in every case: daemon restarts, late daemons, permits that never
come, and a dlopen hook that keeps its caller's library path."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from shimtest import (C_DIR, Client, Daemon, client_env, gcc, kick_sync, log_by_qp, post_count, run_client,
                      wait_for)

from laxflow.protocol.shm import EventKind, Gate, Segment, Stage, proc_start_ticks

ROOT = C_DIR.parents[2]


def reference(native_bin, tmp_path, args):
    log = tmp_path / "reference.log"
    proc = run_client(native_bin, args, client_env(native_bin, log))
    assert proc.returncode == 0, proc.stderr
    return log_by_qp(log)


def tag_all(seg, pid, qps, plan, phase):
    return {qp: seg.tag_qp(pid, qp, request_id=1000 + qp, stage=Stage.P2D, layer=phase, bytes=plan[qp, phase])
            for qp in qps}


def test_daemon_restart_reattaches_and_releases_old_work(native_bin, shim_lib, tmp_path):
    """Daemon A dies (its beat stops, its name is removed) while phase 0 waits
    on its closed gates; daemon B creates the segment anew.  The shim moves to
    B: phase 0 is released (fail open, nothing lost), and phase 1 is gated by
    B's permits, submitted to and completed in B."""
    args = ["direct", "2", "20", "2"]
    ref = reference(native_bin, tmp_path, args)
    a = Daemon()
    b = None
    try:
        log = tmp_path / "shim.log"
        client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim_lib, a.name))
        pid, qps = client.qps()
        plan = client.plan(2, 2)
        tag_all(a.seg, pid, qps, plan, 0)
        client.send()
        client.expect("POSTED 0")
        assert post_count(log) == 0
        a.hang(300_000_000)
        Segment.unlink_name(a.name)
        b = Daemon(name=a.name)
        wait_for(lambda: pid in b.seg.proc_pids(), what="the shim to attach to the new segment")
        assert b.seg.counters()["reattaches"] == 1
        phase0 = a.seg.counters()["wr_deferred"]
        assert phase0 > 0
        failopen = lambda: a.seg.counters()["wr_failopen"] + b.seg.counters()["wr_failopen"]  # noqa: E731
        wait_for(lambda: failopen() == phase0 and post_count(log) == phase0, what="phase 0 to be released")
        msgs = tag_all(b.seg, pid, qps, plan, 1)
        client.send()
        client.expect("POSTED 1")
        kick_sync(b.seg, pid)
        before = post_count(log)
        assert before == phase0
        assert b.seg.counters()["wr_deferred"] > 0  # gated by the new daemon
        submits = b.seg.drain_events()
        assert sorted(submits[submits["kind"] == EventKind.SUBMIT]["msg_id"].tolist()) == sorted(msgs.values())
        for m in msgs.values():
            b.seg.set_permit(m, Gate.OPEN)
        assert client.wait() == 0
        assert post_count(log) > before
        assert log_by_qp(log) == ref
        done = b.seg.drain_events()
        assert sorted(done[done["kind"] == EventKind.COMPLETION]["msg_id"].tolist()) == sorted(msgs.values())
        assert phase0 + b.seg.counters()["wr_deferred"] == sum(len(v) for v in ref.values())
        assert failopen() == phase0
    finally:
        a.close()
        if b:
            b.close()


def test_deferral_has_a_maximum_age(native_bin, shim_lib, tmp_path, daemon):
    """The daemon stays live but never opens the gates: past
    LAXFLOW_MAX_DEFER_MS every WR is released anyway, in order, counted."""
    args = ["direct", "2", "20", "1"]
    ref = reference(native_bin, tmp_path, args)
    log = tmp_path / "shim.log"
    env = client_env(native_bin, log, shim_lib, daemon.name)
    env["LAXFLOW_MAX_DEFER_MS"] = "200"
    client = Client(native_bin, [*args, "--wait"], env)
    pid, qps = client.qps()
    tag_all(daemon.seg, pid, qps, client.plan(2, 1), 0)
    client.send()
    client.expect("POSTED 0")
    assert client.wait() == 0
    assert log_by_qp(log) == ref
    total = sum(len(v) for v in ref.values())
    c = daemon.seg.counters()
    assert c["wr_defer_timeouts"] == c["wr_failopen"] == c["wr_deferred"] == total


LATE = """
import ctypes, socket, sys
shim = ctypes.CDLL(sys.argv[1])
shim.laxflow_shim_layer_boundary.argtypes = [ctypes.c_uint64, ctypes.c_uint32]
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(16)
for line in sys.stdin:
    if line.startswith("api"):
        print(shim.laxflow_shim_active(), shim.laxflow_shim_layer_boundary(5, 9), flush=True)
    else:
        s = socket.create_connection(ls.getsockname()); c, _ = ls.accept(); s.close(); c.close()
        print("connected", flush=True)
"""


def late_process(shim_lib, name):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    env.update(LD_PRELOAD=str(shim_lib), LAXFLOW_SHM_NAME=name)
    return subprocess.Popen([sys.executable, "-c", LATE, str(shim_lib)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def ask(proc, what: str) -> str:
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_c_api_attaches_to_a_daemon_started_later(shim_lib):
    """A process that never opens a verbs device: the exported C API attaches
    lazily (rate-limited) once a daemon appears."""
    name = f"/lxf-test-late-{os.getpid()}"
    proc = late_process(shim_lib, name)
    d = None
    try:
        assert ask(proc, "api") == "0 -1"
        d = Daemon(name=name)
        deadline = time.monotonic() + 10
        while (answer := ask(proc, "api")) != "1 0" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answer == "1 0"
        assert (proc.pid, proc_start_ticks(proc.pid)) in d.seg.procs()  # identity: pid and start time
        ev = d.seg.drain_events()
        assert [(int(e["request_id"]), int(e["layer"])) for e in ev if e["kind"] == EventKind.LAYER_BOUNDARY][-1:] \
            == [(5, 9)]
    finally:
        proc.stdin.close()
        proc.wait(30)
        if d:
            d.close()


def test_socket_calls_attach_to_a_daemon_started_later(shim_lib):
    name = f"/lxf-test-late-tcp-{os.getpid()}"
    proc = late_process(shim_lib, name)
    d = None
    try:
        assert ask(proc, "tcp") == "connected"
        d = Daemon(name=name)
        deadline = time.monotonic() + 10
        while proc.pid not in d.seg.proc_pids() and time.monotonic() < deadline:
            assert ask(proc, "tcp") == "connected"
            time.sleep(0.01)
        assert proc.pid in d.seg.proc_pids()
    finally:
        proc.stdin.close()
        proc.wait(30)
        if d:
            d.close()


def test_tcp_only_process_follows_a_daemon_restart(shim_lib):
    """No verbs, hence no progress thread: the socket calls themselves notice
    the stale segment and move to the new daemon's."""
    name = f"/lxf-test-late-tcp-re-{os.getpid()}"
    a = Daemon(name=name)
    proc = late_process(shim_lib, name)
    b = None
    try:
        assert ask(proc, "tcp") == "connected"
        assert proc.pid in a.seg.proc_pids()
        a.hang(200_000_000)
        Segment.unlink_name(name)
        b = Daemon(name=name)
        deadline = time.monotonic() + 10
        while proc.pid not in b.seg.proc_pids() and time.monotonic() < deadline:
            assert ask(proc, "tcp") == "connected"
            time.sleep(0.01)
        assert proc.pid in b.seg.proc_pids()
        assert b.seg.counters()["reattaches"] == 1
        assert ask(proc, "api") == "1 0"
    finally:
        proc.stdin.close()
        proc.wait(30)
        a.close()
        if b:
            b.close()


def build_origin_case(d):
    """libfoo.so (RUNPATH $ORIGIN/sub) dlopens "libdep.so" from sub/."""
    (d / "sub").mkdir(parents=True)
    src = str(C_DIR / "dlopen_origin.c")
    gcc(d / "sub" / "libdep.so", "-shared", "-fPIC", "-DPART_DEP", src)
    gcc(d / "libfoo.so", "-shared", "-fPIC", "-DPART_FOO", src, "-ldl", "-Wl,--enable-new-dtags",
        "-Wl,-rpath,$ORIGIN/sub")
    return gcc(d / "main", src, "-ldl")


def test_dlopen_hook_keeps_the_callers_runpath_at_O0(shim_lib, tmp_path):
    """The hook must leave glibc's caller-based search intact at any
    optimisation level: a shim built with -O0 still lets libfoo.so find
    libdep.so through its own RUNPATH $ORIGIN/sub."""
    main = build_origin_case(tmp_path / "case")
    out = tmp_path / "O0"
    build = subprocess.run(["make", "-s", "-C", str(ROOT / "native"), f"OUT={out}", "CFLAGS=-O0 -g"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    env["LAXFLOW_SHM_NAME"] = f"/lxf-absent-{os.getpid()}"
    lib = str(tmp_path / "case" / "libfoo.so")
    for shim in (None, out / "liblaxflow_shim.so", shim_lib):
        e = dict(env, **({"LD_PRELOAD": str(shim)} if shim else {}))
        proc = subprocess.run([str(main), lib], env=e, capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stdout.strip()) == (0, "foo=42"), f"{shim}: {proc.stderr}"
