"""The hooks client while the daemon is away: one timeout, then calls that do not wait, then it comes back.

A real :class:`HooksClient` on real ZeroMQ sockets, against an address no
daemon serves and against a real ``laxflow daemon`` process killed with -9
mid-run and started again (tests/daemon/daemontest.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
from daemontest import DaemonProc, wait_for  # noqa: E402  (tests/daemon/daemontest.py)

from laxflow.hooks import HooksClient, Instance  # noqa: E402


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProc(tmp_path)
    yield d
    d.cleanup()


def _one_of_each(hooks: HooksClient, k: int) -> None:
    """Every fire-and-forget call a scheduler or transport makes, once."""
    hooks.register_request(f"r{k}", deadline=time.time() + 5, prompt_tokens=100)
    hooks.batch_formed(f"b{k}", [f"r{k}"], compute_s=0.01)
    hooks.layer_begin(f"b{k}", 0)
    hooks.layer_end(f"b{k}", 0, last=True)
    hooks.message_submit(k + 1, f"r{k}", "p2d", 0, 1e6)
    hooks.message_progress(k + 1, 5e5)
    hooks.message_complete(k + 1)
    hooks.request_done(f"r{k}")


def test_no_daemon_costs_one_timeout_then_calls_return_at_once(tmp_path):
    timeout_ms = 200
    with HooksClient(f"ipc://{tmp_path}/nobody.sock", timeout_ms=timeout_ms, reconnect_ms=(50, 50)) as hooks:
        assert hooks.connected  # optimistic until a call goes unanswered
        hooks.layer_begin("b", 0)  # this one waits its timeout: nobody answers
        assert (hooks.failures, hooks.connected) == (1, False)
        t0 = time.perf_counter()
        for k in range(25):
            _one_of_each(hooks, k)  # 200 events
            assert hooks.wait_permit(k + 1, timeout_s=1.0) is None  # send anyway
            assert hooks.pruned() == set()
            assert hooks.dispatch_advice(f"r{k}", [Instance("i", 0, 0, 0, "", 0)]) == []
            assert hooks.status() is None
        elapsed = time.perf_counter() - t0
        # Nothing else waited for a reply: the one timeout is the only failure, the rest are counted.
        assert hooks.failures == 1
        assert hooks.dropped == 200
        assert hooks.failed_open == 100
        assert hooks.reconnects == 0 and not hooks.connected
        assert hooks.counters() == {"failures": 1, "dropped": 200, "failed_open": 100, "reconnects": 0,
                                    "connected": 0}
        assert elapsed < 300 * timeout_ms / 1e3 / 10  # sanity guard only: 300 calls, far under a timeout each


def test_a_daemon_killed_mid_run_then_restarted_is_reached_again(daemon):
    with HooksClient(daemon.hooks, timeout_ms=200, reconnect_ms=(20, 100)) as hooks:
        _one_of_each(hooks, 0)
        assert hooks.status() is not None and hooks.connected and hooks.failures == 0

        daemon.kill()  # -9: no goodbye, the socket file stays behind
        hooks.layer_begin("b0", 1)  # unanswered: the client notices here, once
        assert (hooks.failures, hooks.connected) == (1, False)
        for k in range(1, 11):
            _one_of_each(hooks, k)
            assert hooks.wait_permit(k + 1, timeout_s=1.0) is None
        assert (hooks.failures, hooks.dropped, hooks.failed_open) == (1, 80, 10)

        daemon.start()  # the same command again: a new daemon on the same hooks address
        wait_for(lambda: hooks.status() is not None, what="the client to reach the restarted daemon")
        assert hooks.connected and hooks.reconnects == 1 and hooks.failures == 1
        failed_open = hooks.failed_open  # 10, plus the status polls made before the probe was answered
        # Calls reach the new daemon again: a message it never saw before gets its permit.
        hooks.register_request("back", deadline=time.time() + 5, prompt_tokens=10)
        hooks.batch_formed("bb", ["back"])
        hooks.layer_begin("bb", 0)
        hooks.message_submit(99, "back", "collective", 0, 1e6, port="eth0")
        assert hooks.wait_permit(99, timeout_s=2.0) == (1, 38)
        assert hooks.status().live_messages == 1
        assert (hooks.failures, hooks.dropped, hooks.failed_open) == (1, 80, failed_open)  # none since


def test_close_stops_the_reconnect_probe(tmp_path):
    hooks = HooksClient(f"ipc://{tmp_path}/nobody.sock", timeout_ms=50, reconnect_ms=(20, 20))
    hooks.request_done("r")
    assert not hooks.connected and hooks.probing
    hooks.close()
    assert not hooks.probing
    hooks.request_done("r")  # after close: dropped and counted, no new thread, no wait
    assert hooks.dropped == 1 and not hooks.probing
