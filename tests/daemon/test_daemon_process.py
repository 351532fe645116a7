"""A real ``laxflow daemon`` process, producers writing into the shim rings, permits read back."""

from __future__ import annotations

import re

from conftest import wait_for

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
