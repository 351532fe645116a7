"""Coordinator + three real daemons on loopback: pruning reaches the shims' permits, daemons outlive the coordinator."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from daemontest import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "coordinator"))
from cptest import CoordinatorProcess  # noqa: E402

from laxflow.coordinator.client import request_status  # noqa: E402
from laxflow.hooks import HooksClient, request_key  # noqa: E402
from laxflow.protocol.shm import EventKind, Gate, Segment, Stage  # noqa: E402

GB = 1e9


@pytest.fixture
def cluster(tmp_path, start_daemon):
    coord = CoordinatorProcess(tmp_path, heartbeat=0.2, dead_after=1.0, drop_budget=1).start()
    cfg = {"heartbeat_s": 0.2, "window_bytes": 0}
    daemons = [start_daemon(node=f"n{i}", ports=(("eth0", 8),), coordinator=coord.address, config=cfg)
               for i in range(3)]  # 8 Gbit/s = 1 GB/s per port
    yield coord, daemons
    coord.stop()


def _status(address, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = request_status(address, timeout_s=1.0)
            if predicate(s):
                return s
        except Exception:  # noqa: BLE001 - the coordinator may be restarting
            s = None
        if time.monotonic() > deadline:
            raise AssertionError(f"coordinator status never matched: {s}")
        time.sleep(0.05)


def _granted(seg, msg_id):
    p = seg.get_permit(msg_id)
    return p if p is not None and p.gate == Gate.OPEN else None


def test_infeasible_batch_heaviest_request_pruned_and_completes_as_scavenger(cluster):
    coord, (n0, n1, n2) = cluster
    _status(coord.address, lambda s: [d.node for d in s.daemons if d.alive] == ["n0", "n1", "n2"])
    seg = Segment.attach(n1.shm)
    try:
        with HooksClient(n1.hooks) as hooks:
            now = time.time()
            hooks.register_request("big", deadline=now + 1.0, prompt_tokens=8000)
            hooks.register_request("small", deadline=now + 1.2, prompt_tokens=100)
            # 5 GB for "big" through a 1 GB/s port cannot make a 1 s deadline; "small" can.
            hooks.batch_formed("doomed", ["big", "small"], compute_s=0.01,
                               traffic={"eth0": {"big": 5 * GB, "small": 0.01 * GB}})
            wait_for(lambda: hooks.pruned() == {"big"}, timeout=20, what="coordinator pruning 'big'")
            wait_for(lambda: 'laxflow_daemon_pruned_requests{node="n1"} 1.0' in n1.metrics(), what="pruned gauge")
            # Sticky until the batch departs: still pruned after the daemon's batch_idle (1 s) and
            # several heartbeats, though no message has been sent yet (it once departed here).
            time.sleep(1.6)
            s = request_status(coord.address, timeout_s=2.0)
            assert s.pruned == (str(request_key("big")),) and s.active_batches == 1, s
            assert hooks.pruned() == {"big"}
            hooks.layer_begin("doomed", 0)
        big, small = seg.alloc_msg_id(), seg.alloc_msg_id()
        # small first: a scavenger message alone on an idle port is granted at once (work conserving),
        # so whether big waits must not depend on both submits landing in one drain of the ring.
        seg.push_event(EventKind.SUBMIT, small, request_key("small"), 1 << 20, Stage.P2D, 0, 1)
        p_small = wait_for(lambda: _granted(seg, small), what="small's permit")
        assert p_small.level < 8
        seg.push_event(EventKind.SUBMIT, big, request_key("big"), 1 << 20, Stage.P2D, 0, 1)
        time.sleep(0.3)
        assert _granted(seg, big) is None  # the scavenger waits behind the live request
        seg.push_event(EventKind.COMPLETION, small, request_key("small"), 1 << 20, Stage.P2D, 0, 1)
        p_big = wait_for(lambda: _granted(seg, big), what="big's permit in the scavenger class")
        assert (p_big.level, p_big.dscp) == (8, 8)  # level K, DSCP CS1: still sent, never dropped
        seg.push_event(EventKind.COMPLETION, big, request_key("big"), 1 << 20, Stage.P2D, 0, 1)
        wait_for(lambda: 'laxflow_daemon_live_messages{node="n1"} 0.0' in n1.metrics(), what="both completed")
        assert 'laxflow_daemon_mode{mode="coordinated",node="n1"} 1.0' in n1.metrics()
    finally:
        seg.close(unlink=False)


def test_kill_9_coordinator_daemons_keep_granting_restart_rebuilds_the_view(cluster):
    coord, daemons = cluster
    n0 = daemons[0]
    _status(coord.address, lambda s: len([d for d in s.daemons if d.alive]) == 3)
    with HooksClient(n0.hooks) as hooks:
        hooks.register_request("r0", deadline=time.time() + 30, prompt_tokens=10)
        hooks.batch_formed("b0", ["r0"], compute_s=0.01, traffic={"eth0": {"r0": 1e6}})
    _status(coord.address, lambda s: s.active_batches == 1)
    coord.kill9()
    seg = Segment.attach(n0.shm)
    try:
        wait_for(lambda: 'laxflow_daemon_coordinator_connected{node="n0"} 0.0' in n0.metrics(), timeout=10,
                 what="daemon noticing the coordinator is gone")
        assert 'laxflow_daemon_mode{mode="local",node="n0"} 1.0' in n0.metrics()
        msg = seg.alloc_msg_id()
        seg.push_event(EventKind.SUBMIT, msg, request_key("r0"), 1 << 20, Stage.COLLECTIVE, 0, 1)
        assert wait_for(lambda: _granted(seg, msg), what="permit without a coordinator").level == 1
    finally:
        seg.close(unlink=False)
    coord.start()  # same ports: the daemons' sockets reconnect, the coordinator asks them to resync
    s = _status(coord.address, lambda s: len([d for d in s.daemons if d.alive]) == 3 and s.active_batches == 1)
    assert [d.node for d in s.daemons] == ["n0", "n1", "n2"]
    wait_for(lambda: 'laxflow_daemon_coordinator_connected{node="n0"} 1.0' in n0.metrics(), timeout=10,
             what="daemon reconnected")
