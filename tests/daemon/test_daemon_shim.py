"""A C verbs program under the real shim (fake verbs provider), gated by a real ``laxflow daemon``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from daemontest import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))
from shimtest import Client, client_env, log_by_qp, run_client  # noqa: E402

from laxflow.protocol.shm import EventKind, Segment, Stage  # noqa: E402
from laxflow.shim import shim_path  # noqa: E402

REQUEST = 77


def _reference(native_bin, tmp_path, args):
    log = tmp_path / "reference.log"
    proc = run_client(native_bin, args, client_env(native_bin, log))
    assert proc.returncode == 0, proc.stderr
    return log_by_qp(log)


def _start_client(native_bin, tmp_path, shm, args, **env):
    log = tmp_path / "shim.log"
    # The shim's own deferral limit (fail open after 300 ms by default) must not release what the daemon holds
    # on a busy test machine; staleness is what these tests exercise.
    env.setdefault("LAXFLOW_MAX_DEFER_MS", "60000")
    client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim_path(), shm, **env))
    pid, qps = client.qps()
    plan = client.plan(len(qps), int(args[3]))
    return client, log, pid, qps, plan


def _tag(seg, pid, qps, plan):
    """As the adapter would: QP 0 carries layer 0's collective, QP 1 the reuse fetch of layer 3."""
    seg.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=0)
    coll = seg.tag_qp(pid, qps[0], REQUEST, Stage.COLLECTIVE, 0, bytes=plan[qps[0], 0])
    reuse = seg.tag_qp(pid, qps[1], REQUEST, Stage.REUSE, 3, bytes=plan[qps[1], 0])
    return coll, reuse


def test_shimmed_program_is_gated_in_policy_order(native_bin, tmp_path, start_daemon):
    d = start_daemon(config={"window_bytes": 0, "stale_ms": 2000})
    seg = Segment.attach(d.shm)
    try:
        args = ["direct", "2", "30", "1"]
        ref = _reference(native_bin, tmp_path, args)
        client, log, pid, qps, plan = _start_client(native_bin, tmp_path, d.shm, args)
        # Another collective of the batch already on the port: the reuse fetch (lower rank) cannot slip in
        # first because it happened to be submitted before the collective.
        blocker = seg.alloc_msg_id()
        seg.push_event(EventKind.SUBMIT, blocker, REQUEST, 1 << 20, Stage.COLLECTIVE, 0, 999)
        coll, reuse = _tag(seg, pid, qps, plan)
        wait_for(lambda: seg.get_permit(blocker), what="blocker granted")
        client.send()
        client.expect("POSTED 0")
        # The collective (same rank as the blocker) goes; the reuse fetch stays held.
        n_coll = len(ref[f"qp={qps[0]}"])
        wait_for(lambda: log.read_text().count(f"POST qp={qps[0]} ") == n_coll, what="collective posted")
        time.sleep(0.05)
        assert seg.get_permit(reuse) is None and f"POST qp={qps[1]} " not in log.read_text()
        seg.push_event(EventKind.COMPLETION, blocker, REQUEST, 1 << 20, Stage.COLLECTIVE, 0, 999)
        assert client.wait() == 0, client.proc.stderr.read()
        assert log_by_qp(log) == ref  # every WR posted exactly once, per-QP order kept
        posts = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("POST ")]
        # The collective (RLI 0) went first; the reuse fetch (RLI 3) waited for its completion (window 0),
        # although both threads posted at once.
        coll_qp, reuse_qp = f"qp={qps[0]}", f"qp={qps[1]}"
        assert posts[:n_coll] == [coll_qp] * n_coll and posts[n_coll:] == [reuse_qp] * len(ref[reuse_qp])
        wait_for(lambda: seg.get_permit(coll) is None and seg.get_permit(reuse) is None,
                 what="finished messages' permit slots cleared")
        counters = seg.counters()
        assert counters["wr_deferred"] > 0 and counters["wr_failopen"] == 0
        text = d.metrics()
        assert 'laxflow_daemon_permits_total{node="n1",port="eth0"} 3.0' in text
    finally:
        seg.close(unlink=False)


def test_kill_9_daemon_with_gated_messages_shims_fail_open_nothing_lost(native_bin, tmp_path, start_daemon):
    d = start_daemon(config={"window_bytes": 0, "stale_ms": 300})
    seg = Segment.attach(d.shm)
    try:
        # The collective's QP is never completed by anyone but its own poller; hold the reuse with a huge
        # collective elsewhere on the port: a hooks-free message nobody completes.
        blocker = seg.alloc_msg_id()
        seg.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=0)
        seg.push_event(EventKind.SUBMIT, blocker, REQUEST, 1 << 30, Stage.COLLECTIVE, 0, 999)
        wait_for(lambda: seg.get_permit(blocker), what="blocker granted")
        args = ["direct", "2", "30", "1"]
        ref = _reference(native_bin, tmp_path, args)
        client, log, pid, qps, plan = _start_client(native_bin, tmp_path, d.shm, args, LAXFLOW_STALE_MS="300")
        _tag(seg, pid, qps, plan)
        client.send()
        client.expect("POSTED 0")
        time.sleep(0.1)
        assert log.read_text().count("POST ") < sum(len(v) for v in ref.values())  # the reuse is held
        d.kill()
        t0 = time.monotonic()
        client.expect("DONE", timeout=30)
        released = time.monotonic() - t0
        assert client.wait() == 0
        assert log_by_qp(log) == ref  # nothing lost, nothing doubled, order kept
        assert seg.counters()["wr_failopen"] > 0
        print(f"shim released the held WRs {released * 1000:.0f} ms after kill -9 (staleness 300 ms)")
    finally:
        seg.close(unlink=False)


def _phase0_then_kill(native_bin, tmp_path, start_daemon, **env):
    """Phase 0 under the first daemon (its collective and reuse fetch tagged and posted), then kill -9."""
    d = start_daemon(config={"window_bytes": 0, "stale_ms": 300})
    args = ["direct", "2", "20", "3"]
    ref = _reference(native_bin, tmp_path, args)
    client, log, pid, qps, plan = _start_client(native_bin, tmp_path, d.shm, args, LAXFLOW_STALE_MS="300", **env)
    seg = Segment.attach(d.shm)
    blocker = seg.alloc_msg_id()
    seg.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=0)
    seg.push_event(EventKind.SUBMIT, blocker, REQUEST, 1 << 30, Stage.COLLECTIVE, 0, 999)
    wait_for(lambda: seg.get_permit(blocker), what="blocker granted")
    seg.tag_qp(pid, qps[0], REQUEST, Stage.COLLECTIVE, 0, bytes=plan[qps[0], 0])
    seg.tag_qp(pid, qps[1], REQUEST, Stage.REUSE, 3, bytes=plan[qps[1], 0])
    client.send()
    client.expect("POSTED 0")
    seg.close(unlink=False)
    d.kill()
    time.sleep(0.5)  # stale: the shim releases phase 0's held WRs
    return d, ref, client, log, pid, qps, plan


def _phase2_is_gated_by_the_new_daemon(d, seg2, ref, client, log, pid, qps, plan):
    """Phase 2 runs under the new daemon: its reuse fetch is held while a higher rank is unfinished, its
    collective is submitted, granted and completed, and nothing is lost or doubled."""
    blocker2 = seg2.alloc_msg_id()
    seg2.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=2)
    seg2.push_event(EventKind.SUBMIT, blocker2, REQUEST, 1 << 30, Stage.COLLECTIVE, 2, 999)
    wait_for(lambda: seg2.get_permit(blocker2), what="new daemon granting")
    seg2.tag_qp(pid, qps[0], REQUEST, Stage.COLLECTIVE, 2, bytes=plan[qps[0], 2])
    reuse = seg2.tag_qp(pid, qps[1], REQUEST, Stage.REUSE, 5, bytes=plan[qps[1], 2])
    posted_before = sum(1 for line in log.read_text().splitlines() if line.startswith(f"POST qp={qps[1]} "))
    client.send()
    client.expect("POSTED 2")
    time.sleep(0.1)
    assert seg2.get_permit(reuse) is None
    held = sum(1 for line in log.read_text().splitlines() if line.startswith(f"POST qp={qps[1]} "))
    assert held == posted_before  # none of phase 2's reuse WRs reached the device
    assert seg2.counters()["wr_deferred"] > 0
    seg2.push_event(EventKind.COMPLETION, blocker2, REQUEST, 1 << 30, Stage.COLLECTIVE, 2, 999)
    client.expect("DONE", timeout=30)  # the new daemon granted the reuse fetch once the port freed up
    assert client.wait() == 0
    assert log_by_qp(log) == ref  # all three phases, nothing lost or doubled
    counters = seg2.counters()
    assert counters["wr_released"] == counters["wr_deferred"] > 0 and counters["wr_failopen"] == 0
    wait_for(lambda: 'laxflow_daemon_permits_total{node="n1",port="eth0"} 3.0' in d.metrics(),
             what="blocker, collective and reuse permits from the new daemon")


def test_restarted_daemon_gates_the_shims_again(native_bin, tmp_path, start_daemon):
    """kill -9 with WRs held: released by the shim; the daemon restarts on the same name: the shim re-attaches
    and the next layer's reuse fetch is held by the new daemon again until the port frees up."""
    d, ref, client, log, pid, qps, plan = _phase0_then_kill(native_bin, tmp_path, start_daemon)
    d.start()  # replaces the stale segment
    seg2 = Segment.attach(d.shm)
    try:
        # Phase 1: the shim's next verbs calls find the new segment (it checks every 20 ms at most).
        client.send()
        client.expect("POSTED 1")
        wait_for(lambda: seg2.counters()["reattaches"] >= 1, what="the shim re-attaching")
        _phase2_is_gated_by_the_new_daemon(d, seg2, ref, client, log, pid, qps, plan)
    finally:
        seg2.close(unlink=False)


def test_a_post_racing_the_reattach_keeps_old_tags_out_of_the_new_daemon(native_bin, tmp_path, start_daemon):
    """The restart race, made to happen: phase 1's first post reads the old (stale) segment and its flow tag,
    then is held (LAXFLOW_TEST_PAUSE_POST) while the daemon restarts and the shim's progress thread moves to
    the new segment.  Released, the post must not open the old tag's message under the new generation (its
    id would collide with the new daemon's own ids), and phase 2 must be gated by the new daemon as if
    nothing had happened."""
    gate = tmp_path / "pause-post"
    d, ref, client, log, pid, qps, plan = _phase0_then_kill(native_bin, tmp_path, start_daemon,
                                                            LAXFLOW_TEST_PAUSE_POST=str(gate))
    gate.touch()
    client.send()  # phase 1: its first post stops in the window, holding the old segment's tag
    wait_for(lambda: Path(f"{gate}.waiting").exists(), what="a poster held inside the window")
    d.start()  # replaces the stale segment
    seg2 = Segment.attach(d.shm)
    try:
        wait_for(lambda: seg2.counters()["reattaches"] >= 1, what="the shim re-attaching while the post is held")
        time.sleep(0.05)  # the progress thread's next turns see the new daemon live
        gate.unlink()
        client.expect("POSTED 1")
        # Phase 1's tags were the old daemon's: the new daemon never heard of those messages, so it neither
        # holds nor grants any of them (before the fix the held post submitted the old tag's id to the new
        # daemon under the new generation: the new daemon granted it as its own id 2, and phase 1's reuse
        # WRs were held behind that never-completed collective).
        time.sleep(0.3)  # the daemon refreshes its gauges every 250 ms
        assert seg2.counters()["wr_deferred"] == 0
        text = d.metrics()
        assert 'laxflow_daemon_permits_total{node="n1",port="eth0"} 0.0' in text
        assert 'laxflow_daemon_live_messages{node="n1"} 0.0' in text
        _phase2_is_gated_by_the_new_daemon(d, seg2, ref, client, log, pid, qps, plan)
    finally:
        gate.unlink(missing_ok=True)
        seg2.close(unlink=False)


def test_a_restarted_daemons_message_ids_are_new(tmp_path):
    """A new segment on the same name never hands out the ids its predecessor did: a shim still holding an
    old message cannot mistake it for one of the new daemon's."""
    name = f"/lxf-ids-{time.monotonic_ns()}"
    first = Segment.create(name)
    try:
        old = [first.alloc_msg_id() for _ in range(1000)]
    finally:
        first.close(unlink=True)
    time.sleep(0.002)
    second = Segment.create(name)
    try:
        new = [second.alloc_msg_id() for _ in range(1000)]
    finally:
        second.close(unlink=True)
    assert not set(old) & set(new)
    assert all(0 < i < 1 << 40 for i in old + new)
