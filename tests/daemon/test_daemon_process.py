"""A real ``laxflow daemon`` process, producers writing into the shim rings, permits read back."""

from __future__ import annotations

import re

from daemontest import wait_for

from laxflow.hooks import HooksClient, request_key
from laxflow.protocol.shm import EventKind, Gate, Segment, Stage


def permit(seg: Segment, msg_id: int):
    p = seg.get_permit(msg_id)
    return p if p is not None and p.gate == Gate.OPEN else None


def test_producer_events_get_permits_levels_and_dscp_as_the_policy_says(start_daemon):
    d = start_daemon()
    seg = Segment.attach(d.shm)
    try:
        req = request_key("req-A")
        with HooksClient(d.hooks) as hooks:
            hooks.register_request("req-A", deadline=None, prompt_tokens=1000)
            hooks.batch_formed("batch-A", ["req-A"])
        # The adapter's boundary: layer 0 computes now (LAYER_BOUNDARY event on the ring).
        assert seg.push_event(EventKind.LAYER_BOUNDARY, request_id=req, layer=0)
        coll, reuse = seg.alloc_msg_id(), seg.alloc_msg_id()
        assert seg.push_event(EventKind.SUBMIT, coll, req, 1 << 20, Stage.COLLECTIVE, 0, handle=1)
        assert seg.push_event(EventKind.SUBMIT, reuse, req, 1 << 20, Stage.REUSE, 3, handle=1)
        p = wait_for(lambda: permit(seg, coll), what="collective permit")
        assert (p.level, p.dscp) == (1, 38)  # RLI 0 -> RMLQ level 1 -> DSCP 38
        # The reuse fetch 3 layers ahead waits while the collective's 1 MiB is unfinished (window 250 KB).
        assert permit(seg, reuse) is None
        assert seg.push_event(EventKind.COMPLETION, coll, req, 1 << 20, Stage.COLLECTIVE, 0, handle=1)
        p = wait_for(lambda: permit(seg, reuse), what="reuse permit")
        assert (p.level, p.dscp) == (4, 35)  # RLI 3 -> level 4
        wait_for(lambda: seg.get_permit(coll) is None, what="finished message's slot cleared")
        text = d.metrics()
        assert re.search(r'laxflow_daemon_permits_total\{node="n1",port="eth0"\} 2\.0', text)
        assert 'laxflow_daemon_mode{mode="local",node="n1"} 1.0' in text
    finally:
        seg.close(unlink=False)


def test_two_batches_competing_for_one_port_come_out_in_red_order(start_daemon):
    """Same RMLQ level (collectives, RLI 0) on one port: the batch with the earlier RED goes first."""
    import time

    d = start_daemon(config={"window_bytes": 0})
    seg = Segment.attach(d.shm)
    try:
        now = time.time()
        with HooksClient(d.hooks) as hooks:
            # Batch "loose": one request due in 5 s. Batch "tight": two requests due in 1 s and 1.1 s.
            hooks.register_request("loose-1", deadline=now + 5.0, prompt_tokens=100)
            hooks.register_request("tight-1", deadline=now + 1.0, prompt_tokens=100)
            hooks.register_request("tight-2", deadline=now + 1.1, prompt_tokens=100)
            hooks.register_request("blocker-1", deadline=now + 0.5, prompt_tokens=100)
            hooks.batch_formed("loose", ["loose-1"])
            hooks.batch_formed("tight", ["tight-1", "tight-2"])
            hooks.batch_formed("blocker", ["blocker-1"])
            for batch in ("loose", "tight", "blocker"):
                hooks.layer_begin(batch, 0)
        # A blocker holds the port first: a message alone on an idle port is granted at once (work
        # conserving), so the two batches must both be waiting before the port frees up, whatever
        # ring drain their submits land in.
        blocker = seg.alloc_msg_id()
        assert seg.push_event(EventKind.SUBMIT, blocker, request_key("blocker-1"), 1 << 20, Stage.COLLECTIVE, 0, 1)
        wait_for(lambda: permit(seg, blocker), what="the blocker's permit")
        msgs = {}
        # The loose batch submits first: arrival order must not decide.
        for name, req in (("loose", "loose-1"), ("tight", "tight-1")):
            msgs[name] = seg.alloc_msg_id()
            assert seg.push_event(EventKind.SUBMIT, msgs[name], request_key(req), 1 << 20, Stage.COLLECTIVE, 0, 1)
        time.sleep(0.3)
        assert permit(seg, msgs["loose"]) is None and permit(seg, msgs["tight"]) is None  # strict: behind it
        seg.push_event(EventKind.COMPLETION, blocker, request_key("blocker-1"), 1 << 20, Stage.COLLECTIVE, 0, 1)
        p = wait_for(lambda: permit(seg, msgs["tight"]), what="tight batch's permit")
        assert p.level == 1
        time.sleep(0.05)
        assert permit(seg, msgs["loose"]) is None  # strict (window 0): waits for the tight batch
        seg.push_event(EventKind.COMPLETION, msgs["tight"], request_key("tight-1"), 1 << 20, Stage.COLLECTIVE, 0, 1)
        assert wait_for(lambda: permit(seg, msgs["loose"]), what="loose batch's permit").level == 1
    finally:
        seg.close(unlink=False)


def test_sigterm_opens_every_gate_and_leaves_a_valid_segment(start_daemon):
    import time

    d = start_daemon(config={"window_bytes": 0, "stale_ms": 200})
    seg = Segment.attach(d.shm)
    try:
        req = request_key("r")
        seg.push_event(EventKind.LAYER_BOUNDARY, request_id=req, layer=0)
        ids = [seg.alloc_msg_id() for _ in range(4)]
        for layer, msg in enumerate(ids):
            seg.push_event(EventKind.SUBMIT, msg, req, 1 << 20, Stage.REUSE, layer, 1)
        wait_for(lambda: permit(seg, ids[0]), what="first permit")
        time.sleep(0.05)
        assert [permit(seg, m) is not None for m in ids] == [True, False, False, False]
        assert d.terminate() == 0
        assert all(permit(seg, m) is not None for m in ids)  # nothing is held after the daemon leaves
        again = Segment.attach(d.shm)  # still a valid segment for shims that map it now
        assert again.version == seg.version
        time.sleep(0.25)
        assert not again.live()  # heartbeat stale: shims pass through
        again.close(unlink=False)
        assert "gates open" in "".join(d.log)
    finally:
        seg.close(unlink=False)


def test_restart_replaces_the_stale_segment_and_a_second_daemon_is_refused(start_daemon):
    import subprocess

    d = start_daemon()
    second = subprocess.run([*d.args[:-4]], capture_output=True, text=True, timeout=60)  # same --shm, no hooks/metrics
    assert second.returncode == 2
    assert "another daemon is running on this segment" in second.stderr
    d.kill()  # kill -9: the segment stays behind with a stale heartbeat
    import time

    time.sleep(0.15)
    d.start()  # the same command again takes it over
    assert d.proc.poll() is None
