"""The shim under real programs: both verbs call paths, deferral, fail-open.

Each test runs c/verbs_client.c (one poster thread per QP) against the fake
libibverbs, without the shim for a reference and with it, and compares what
the fake device received.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from shimtest import Client, client_env, flap_stress, kick_sync, log_by_qp, post_count, run_client, wait_for

from laxflow.protocol.shm import EventKind, Gate, Segment, Stage

# direct: linked with -libverbs (Mooncake); dlopen: NCCL's ibvwrap; ex: the
# extended API (ibv_create_qp_ex, ibv_wr_*, ibv_create_cq_ex / ibv_start_poll)
MODES = ["direct", "dlopen", "ex"]


def reference(native_bin, tmp_path, args) -> dict[str, list[str]]:
    log = tmp_path / "reference.log"
    proc = run_client(native_bin, args, client_env(native_bin, log))
    assert proc.returncode == 0, proc.stderr
    return log_by_qp(log)


def drain(seg: Segment, kind: int):
    events = seg.drain_events()
    return events[events["kind"] == kind]


def tag_all(seg: Segment, pid: int, qps: list[int], plan, phase: int, dscp: int = -1) -> dict[int, int]:
    """Tag each QP with a new message of this phase; returns qp -> msg_id."""
    return {
        qp: seg.tag_qp(pid, qp, request_id=1000 + qp, stage=Stage.P2D, layer=phase,
                       bytes=plan[qp, phase], dscp=dscp)
        for qp in qps
    }


@pytest.mark.parametrize("mode", MODES)
def test_fail_open_without_daemon_is_byte_identical(native_bin, shim_lib, tmp_path, mode):
    args = [mode, "1", "40", "2"]  # one QP: the whole log is deterministic
    ref_log, shim_log = tmp_path / "ref.log", tmp_path / "shim.log"
    ref = run_client(native_bin, args, client_env(native_bin, ref_log))
    under = run_client(native_bin, args, client_env(native_bin, shim_log, shim=shim_lib))
    assert ref.returncode == under.returncode == 0, under.stderr
    assert shim_log.read_bytes() == ref_log.read_bytes()
    strip = lambda out: [l for l in out.splitlines() if not l.startswith(("QPS", "HANDLE"))]  # noqa: E731
    assert strip(under.stdout) == strip(ref.stdout)
    assert "CLOSE ops-not-restored" not in shim_log.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_gated_chains_deferred_then_posted_identical(native_bin, shim_lib, tmp_path, daemon, mode):
    """4 threads post concurrently on 4 QPs whose gates are closed: nothing
    reaches the device; once the gates open every chain is posted exactly once,
    byte-identical and in per-QP order, and the daemon sees one submit and one
    completion per message."""
    args = [mode, "4", "60", "1"]
    ref = reference(native_bin, tmp_path, args)
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim_lib, daemon.name))
    if mode == "dlopen":
        assert client.expect("HANDLE") == "HANDLE shim=1"
    pid, qps = client.qps()
    plan = client.plan(4, 1)
    msgs = tag_all(daemon.seg, pid, qps, plan, 0)
    client.send()
    client.expect("POSTED 0")
    total = sum(len(v) for v in ref.values())
    assert post_count(log) == 0
    assert daemon.seg.counters()["wr_deferred"] == total
    submits = drain(daemon.seg, EventKind.SUBMIT)
    assert sorted(submits["msg_id"].tolist()) == sorted(msgs.values())
    assert {int(e["handle"]): int(e["bytes"]) for e in submits} == {qp: plan[qp, 0] for qp in qps}
    for msg in msgs.values():
        daemon.seg.set_permit(msg, Gate.OPEN)
    assert client.wait() == 0, client.proc.stderr.read()
    assert log_by_qp(log) == ref
    counters = daemon.seg.counters()
    assert counters["wr_released"] == total and counters["wr_failopen"] == 0
    completions = drain(daemon.seg, EventKind.COMPLETION)
    assert sorted(completions["msg_id"].tolist()) == sorted(msgs.values())
    assert "CLOSE ops-not-restored" not in log.read_text()


def test_later_messages_wait_behind_earlier_ones(native_bin, shim_lib, tmp_path, daemon):
    """Three messages per QP, gates opened newest first: per-QP FIFO order
    means nothing moves until the oldest opens."""
    args = ["direct", "4", "20", "3"]
    ref = reference(native_bin, tmp_path, args)
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim_lib, daemon.name))
    pid, qps = client.qps()
    plan = client.plan(4, 3)
    phases = []
    for phase in range(3):
        phases.append(tag_all(daemon.seg, pid, qps, plan, phase))
        client.send()
        client.expect(f"POSTED {phase}")
    for phase in (2, 1):
        for msg in phases[phase].values():
            daemon.seg.set_permit(msg, Gate.OPEN)
    kick_sync(daemon.seg, pid)  # a release pass has run since the gates opened
    assert post_count(log) == 0
    assert daemon.seg.counters()["wr_released"] == 0
    for msg in phases[0].values():
        daemon.seg.set_permit(msg, Gate.OPEN)
    assert client.wait() == 0
    assert log_by_qp(log) == ref
    completions = drain(daemon.seg, EventKind.COMPLETION)
    assert len(completions) == 12 and len(set(completions["msg_id"].tolist())) == 12


def test_signal_all_qp_tracks_completions(native_bin, shim_lib, tmp_path, daemon):
    args = ["direct", "2", "30", "1", "--sig-all"]
    ref = reference(native_bin, tmp_path, args)
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim_lib, daemon.name))
    pid, qps = client.qps()
    plan = client.plan(2, 1)
    msgs = tag_all(daemon.seg, pid, qps, plan, 0)
    client.send()
    client.expect("POSTED 0")
    for msg in msgs.values():
        daemon.seg.set_permit(msg, Gate.OPEN)
    assert client.wait() == 0
    assert log_by_qp(log) == ref
    assert sorted(drain(daemon.seg, EventKind.COMPLETION)["msg_id"].tolist()) == sorted(msgs.values())


def test_open_gate_posts_at_once(native_bin, shim_lib, tmp_path, daemon):
    args = ["direct", "2", "20", "1"]
    ref = reference(native_bin, tmp_path, args)
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim_lib, daemon.name))
    pid, qps = client.qps()
    plan = client.plan(2, 1)
    for msg in tag_all(daemon.seg, pid, qps, plan, 0).values():
        daemon.seg.set_permit(msg, Gate.OPEN)
    client.send()
    assert client.wait() == 0
    assert log_by_qp(log) == ref
    assert daemon.seg.counters()["wr_deferred"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_modify_qp_traffic_class(native_bin, shim_lib, tmp_path, daemon, mode):
    # static rule: LAXFLOW_DSCP, no daemon
    log = tmp_path / "static.log"
    proc = run_client(native_bin, [mode, "2", "1", "1"], client_env(native_bin, log, shim_lib, LAXFLOW_DSCP="46"))
    assert proc.returncode == 0, proc.stderr
    modifies = [l for l in log.read_text().splitlines() if l.startswith("MODIFY")]
    # client asks for 0x15 (DSCP 5, ECN 01): DSCP rewritten, ECN kept
    assert modifies and all(l.endswith(f"traffic_class={46 << 2 | 1}") for l in modifies)
    # per-QP class from the flow tag, in daemon mode
    log = tmp_path / "tagged.log"
    client = Client(native_bin, [mode, "2", "1", "1", "--wait"], client_env(native_bin, log, shim_lib, daemon.name))
    pid, qps = client.qps()
    client.plan(2, 1)
    daemon.seg.tag_qp(pid, qps[0], request_id=1, stage=Stage.COLLECTIVE, layer=0, dscp=26)
    client.send()
    client.expect("POSTED 0")
    daemon.seg.set_permit(daemon.seg.read_tag(pid, 1, qps[0]).msg_id, Gate.OPEN)
    assert client.wait() == 0
    tc = {l.split()[1]: l.split()[-1] for l in log.read_text().splitlines() if l.startswith("MODIFY")}
    assert tc == {f"qp={qps[0]}": f"traffic_class={26 << 2 | 1}", f"qp={qps[1]}": "traffic_class=21"}


def test_version_mismatch_and_stale_heartbeat_pass_through(native_bin, shim_lib, tmp_path, daemon):
    args = ["direct", "2", "20", "1", "--wait"]
    for case in ("stale", "version"):
        log = tmp_path / f"{case}.log"
        if case == "stale":
            daemon.hang(100_000_000)
            daemon.seg.raw.header.heartbeat_ns = 1
        else:
            daemon.seg.raw.header.version = 99
        client = Client(native_bin, args, client_env(native_bin, log, shim_lib, daemon.name))
        pid, qps = client.qps()
        plan = client.plan(2, 1)
        tag_all(daemon.seg, pid, qps, plan, 0)  # closed gates, which must not matter
        client.send()
        assert client.wait() == 0
        assert post_count(log) > 0
    assert daemon.seg.counters()["wr_deferred"] == 0
    assert len(daemon.seg.drain_events()) == 0


DAEMON = """
import sys, time
from laxflow.protocol.shm import Segment
seg = Segment.create(sys.argv[1])
print("ready", flush=True)
while True:  # the consumer: beats, drains events, grants nothing
    seg.heartbeat()
    seg.drain_events()
    time.sleep(0.002)
"""


def test_killed_daemon_releases_every_deferred_wr(native_bin, shim_lib, tmp_path):
    """SIGKILL the segment's owner mid-stream: within the heartbeat timeout
    the shim posts every deferred WR, in order, none lost."""
    name = f"/lxf-test-kill-{os.getpid()}"
    Segment.unlink_name(name)
    owner = subprocess.Popen([sys.executable, "-c", DAEMON, name], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        seg = Segment.attach(name)
        args = ["direct", "4", "40", "1"]
        ref = reference(native_bin, tmp_path, args)
        log = tmp_path / "shim.log"
        env = client_env(native_bin, log, shim_lib, name, LAXFLOW_STALE_MS="300")
        client = Client(native_bin, [*args, "--wait"], env)
        pid, qps = client.qps()
        plan = client.plan(4, 1)
        tag_all(seg, pid, qps, plan, 0)
        client.send()
        client.expect("POSTED 0")
        assert post_count(log) == 0
        deadline = time.monotonic() + 10
        while seg.raw.events.head < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seg.raw.events.head == 4  # the consumer took the 4 submits
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        t0 = time.monotonic()
        client.expect("DONE", timeout=30)
        released_after = time.monotonic() - t0
        assert client.wait() == 0
        assert log_by_qp(log) == ref
        total = sum(len(v) for v in ref.values())
        assert seg.counters()["wr_failopen"] == total
        print(f"released {total} WRs {released_after * 1000:.0f} ms after the kill (stale after 300 ms)")
        seg.close()
    finally:
        owner.kill()
        owner.wait()
        Segment.unlink_name(name)


@pytest.mark.parametrize("mode", ["direct", "ex"])
def test_refused_release_becomes_error_completion(native_bin, shim_lib, tmp_path, daemon, mode):
    # wr_id 3 of thread 0 is its 4th WR, signaled; the fake refuses it.  In
    # ex mode the error completions come through ibv_start_poll / next_poll.
    log = tmp_path / "shim.log"
    env = client_env(native_bin, log, shim_lib, daemon.name, FAKEVERBS_FAIL_WRID="3")
    client = Client(native_bin, [mode, "1", "10", "1", "--wait"], env)
    pid, qps = client.qps()
    plan = client.plan(1, 1)
    msgs = tag_all(daemon.seg, pid, qps, plan, 0)
    client.send()
    client.expect("POSTED 0")
    daemon.seg.set_permit(msgs[qps[0]], Gate.OPEN)
    done = client.expect("DONE")
    assert client.wait() == 0
    # the refused chain is WRs 3 (signaled), 4 and 5 (unsignaled)
    assert " errors=1 unsignaled_errors=2 " in done
    assert daemon.seg.counters()["wr_post_errors"] == 3


def test_refused_unsignaled_wrs_are_reported(native_bin, shim_lib, tmp_path, daemon):
    """A refused chain of unsignaled WRs (1 and 2) still comes back as error
    completions, as the device reports errors whether signaled or not."""
    log = tmp_path / "shim.log"
    env = client_env(native_bin, log, shim_lib, daemon.name, FAKEVERBS_FAIL_WRID="1")
    client = Client(native_bin, ["direct", "1", "10", "1", "--wait"], env)
    pid, qps = client.qps()
    msgs = tag_all(daemon.seg, pid, qps, client.plan(1, 1), 0)
    client.send()
    client.expect("POSTED 0")
    daemon.seg.set_permit(msgs[qps[0]], Gate.OPEN)
    done = client.expect("DONE")
    assert client.wait() == 0
    assert " errors=0 unsignaled_errors=2 " in done
    assert daemon.seg.counters()["wr_post_errors"] == 2


def test_injected_errors_past_the_buffer_are_counted(native_bin, shim_lib, tmp_path, daemon):
    """The device refuses every released chain: 300 WRs come back as error
    completions, of which the shim's buffer holds 256 (until polled); the
    rest are counted as dropped, none silently lost."""
    log = tmp_path / "shim.log"
    env = client_env(native_bin, log, shim_lib, daemon.name, FAKEVERBS_FAIL_ALL="1")
    client = Client(native_bin, ["direct", "1", "150", "1", "--wait", "--poll-timeout", "1", "--hold-poll"], env)
    pid, qps = client.qps()
    msgs = tag_all(daemon.seg, pid, qps, client.plan(1, 1), 0)
    client.send()
    client.expect("POSTED 0")
    daemon.seg.set_permit(msgs[qps[0]], Gate.OPEN)
    deferred = daemon.seg.counters()["wr_deferred"]
    wait_for(lambda: daemon.seg.counters()["wr_post_errors"] == deferred, what="every chain to be refused")
    client.send()  # only now does the client poll
    done = client.expect("DONE")
    client.wait()
    c = daemon.seg.counters()
    reported = int(done.split(" errors=")[1].split()[0]) + int(done.split("unsignaled_errors=")[1].split()[0])
    assert c["wr_post_errors"] == c["wr_deferred"] > 256
    assert reported == 256
    assert c["injected_dropped"] == c["wr_post_errors"] - 256


def test_commands_release_and_pass_through(native_bin, shim_lib, tmp_path, daemon):
    log = tmp_path / "shim.log"
    client = Client(native_bin, ["direct", "2", "20", "2", "--wait"], client_env(native_bin, log, shim_lib, daemon.name))
    pid, qps = client.qps()
    plan = client.plan(2, 2)
    tag_all(daemon.seg, pid, qps, plan, 0)
    client.send()
    client.expect("POSTED 0")
    assert post_count(log) == 0
    assert pid in daemon.seg.proc_pids()
    assert daemon.seg.send_command(pid, 2)  # RELEASE_ALL
    deadline = time.monotonic() + 10
    while daemon.seg.counters()["wr_released"] < daemon.seg.counters()["wr_deferred"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert post_count(log) == daemon.seg.counters()["wr_deferred"] > 0
    released = post_count(log)
    assert daemon.seg.send_command(pid, 3)  # PASS_THROUGH: new closed gates no longer hold
    kick_sync(daemon.seg, pid)  # the PASS_THROUGH was handled
    deferred = daemon.seg.counters()["wr_deferred"]
    tag_all(daemon.seg, pid, qps, plan, 1)
    client.send()
    client.expect("POSTED 1")
    # phase 1 reached the device while posted, its gates closed
    assert post_count(log) > released
    assert daemon.seg.counters()["wr_deferred"] == deferred
    assert client.wait() == 0
    assert daemon.seg.counters()["wr_deferred"] == daemon.seg.counters()["wr_released"]


@pytest.mark.parametrize("mode", ["direct", "ex"])
def test_threads_sharing_qps_while_gates_flap(native_bin, shim_lib, tmp_path, daemon, mode):
    """2 threads per QP post while the daemon flips gates open and closed at
    random and a third thread reaps completions: every chain still reaches
    the device exactly once, whole, and in each thread's order."""
    flap_stress(native_bin, shim_lib, daemon, tmp_path, [mode, "2", "150", "2", "--tpq", "2", "--poll"])


ADAPTER = """
import ctypes, sys
shim = ctypes.CDLL(sys.argv[1])
shim.laxflow_shim_layer_boundary.argtypes = [ctypes.c_uint64, ctypes.c_uint32]
print(shim.laxflow_shim_active(), shim.laxflow_shim_layer_boundary(7, 12))
"""


def test_c_api_layer_boundary_and_active(shim_lib, daemon):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    env.update(LD_PRELOAD=str(shim_lib), LAXFLOW_SHM_NAME=daemon.name)
    proc = subprocess.run([sys.executable, "-c", ADAPTER, str(shim_lib)], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    assert proc.stdout.split() == ["1", "0"]
    events = drain(daemon.seg, EventKind.LAYER_BOUNDARY)
    assert [(int(e["request_id"]), int(e["layer"])) for e in events] == [(7, 12)]
    env["LAXFLOW_SHM_NAME"] = f"/lxf-absent-{os.getpid()}"
    proc = subprocess.run([sys.executable, "-c", ADAPTER, str(shim_lib)], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    assert proc.stdout.split() == ["0", "-1"]  # no daemon: inactive, nothing to tell
