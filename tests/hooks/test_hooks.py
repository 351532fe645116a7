"""The hooks API against a real daemon over ipc:// (in process against a core: tests/daemon/test_daemon_inprocess.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import zmq

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
from daemontest import DaemonProc, wait_for  # noqa: E402  (tests/daemon/daemontest.py)

from laxflow.hooks import HooksClient, Instance, request_key  # noqa: E402
from laxflow.protocol import hooks as hm  # noqa: E402
from laxflow.protocol.wire import decode, encode  # noqa: E402

@pytest.fixture
def start_daemon(tmp_path):
    started = []

    def start(**kw):
        d = DaemonProc(tmp_path, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.cleanup()


def test_request_key_joins_hooks_names_and_shm_ids():
    assert request_key("12345") == 12345
    assert request_key(7) == 7
    assert request_key("cmpl-abc") == request_key("cmpl-abc") != request_key("cmpl-abd")
    assert 0 < request_key("cmpl-abc") < 1 << 63


def test_client_round_trip_permits_pruning_advice_and_status(start_daemon):
    d = start_daemon(config={"window_bytes": 0, "mfs": {"drop_budget": 1}})
    seen: list[set[str]] = []
    with HooksClient(d.hooks) as hooks:
        hooks.subscribe_pruned(seen.append)
        now = time.time()
        hooks.register_request("ok", deadline=now + 10, prompt_tokens=100)
        hooks.register_request("doomed", deadline=now + 0.002, prompt_tokens=100)
        hooks.batch_formed("b1", ["ok"], compute_s=0.01)
        hooks.batch_formed("b2", ["doomed"], compute_s=0.01)
        hooks.layer_begin("b1", 0)
        hooks.layer_begin("b2", 0)
        # A transport without the shim: submit, wait for the permit, report progress, complete.
        hooks.message_submit(1, "ok", "collective", 0, 1e6, port="eth0")
        assert hooks.wait_permit(1, timeout_s=2.0) == (1, 38)
        # 10 GB due in 2 ms on a 12.5 GB/s port: Algorithm 1 prunes it into the scavenger class.
        hooks.message_submit(2, "doomed", "p2d", 0, 1e10)
        hooks.message_progress(1, 5e5)
        hooks.message_complete(1)
        assert hooks.wait_permit(2, timeout_s=2.0) == (8, 8)  # scavenger: level K, DSCP CS1
        assert hooks.pruned() == {"doomed"}
        wait_for(lambda: {"doomed"} in seen, what="pruning advice on the subscription")
        ranked = hooks.dispatch_advice("new", [
            Instance("far", queue_s=0.0, compute_s=0.05, nbytes=2.5e9, port="eth0", bandwidth=0.0),
            Instance("busy", queue_s=0.3, compute_s=0.05, nbytes=0.0, port="", bandwidth=0.0),
            Instance("near", queue_s=0.0, compute_s=0.05, nbytes=1.25e8, port="eth0", bandwidth=0.0),
        ])
        assert [e.name for e in ranked] == ["near", "far", "busy"]  # 0.06 s, 0.25 s, 0.35 s
        assert ranked[0].network_s == pytest.approx(0.01, rel=0.05)
        st = hooks.status()
        assert (st.node, st.mode, st.ports) == ("n1", "local", ("eth0",))
        hooks.request_done("ok")
        assert str(request_key("ok")) not in hooks._names  # over: its name is dropped
        hooks.request_done("doomed")
        assert hooks._names[str(request_key("doomed"))] == "doomed"  # over but last seen pruned: kept for pruned()
        assert hooks.failures == 0


def test_bad_frames_are_counted_and_answered_and_the_daemon_goes_on(start_daemon):
    d = start_daemon()
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d.hooks)
    rnd = os.urandom
    frames = [b"", b"\x00", rnd(64), encode(hm.Complete(5), "x")[:-3],
              encode(hm.Submit(9, "r", "reuse", 1, 10.0, "eth9", 0.0), "x")]  # unknown port: a clear error
    for f in frames:
        s.send(f)
        assert s.poll(2000)
        reply = decode(s.recv()).body
        assert isinstance(reply, hm.Ack) and not reply.ok and reply.error
    assert "unknown port 'eth9'" in reply.error
    s.close()
    with HooksClient(d.hooks) as hooks:
        assert hooks.status() is not None  # still serving
    text = d.metrics()
    assert 'laxflow_daemon_bad_events_total{node="n1"} 5.0' in text or wait_for(
        lambda: 'laxflow_daemon_bad_events_total{node="n1"} 5.0' in d.metrics(), what="bad events counted")


def test_client_without_a_daemon_fails_quietly(tmp_path):
    with HooksClient(f"ipc://{tmp_path}/nobody.sock", timeout_ms=50) as hooks:
        hooks.register_request("r", deadline=None, prompt_tokens=1)
        assert hooks.wait_permit(1, timeout_s=0.05) is None  # fail open: the caller sends anyway
        assert hooks.pruned() == set()
        # One call waited; the two after it failed open at once (tests/hooks/test_hooks_failopen.py).
        assert (hooks.failures, hooks.failed_open, hooks.connected) == (1, 2, False)


def test_client_drops_the_names_of_done_requests_100k(tmp_path):
    # The client keeps key -> name per request for pruned(); 100k requests in a row must not leave 100k entries.
    with HooksClient(f"ipc://{tmp_path}/nobody.sock", timeout_ms=1) as hooks:
        most = 0
        for i in range(100_000):
            hooks.register_request(f"req-{i}", deadline=None, prompt_tokens=1)
            hooks.message_submit(i + 1, f"req-{i}", "p2d", 0, 1e3)
            hooks.request_done(f"req-{i}")
            most = max(most, len(hooks._names))
        assert most <= 1 and len(hooks._names) == 0
        assert (hooks.failures, hooks.dropped) == (1, 300_000 - 1)  # no daemon: dropped, counted, not kept


def test_in_process_hooks_are_found_beside_the_daemon_not_in_hooks():
    import laxflow.hooks

    with pytest.raises(AttributeError, match=r"laxflow\.daemon\.inprocess\.InProcessHooks"):
        laxflow.hooks.InProcessHooks  # noqa: B018
    assert "InProcessHooks" not in laxflow.hooks.__all__
