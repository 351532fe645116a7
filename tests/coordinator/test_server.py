"""The coordinator as a real process on loopback, with daemon-side test clients."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from cptest import GB, LAXFLOW, CoordinatorProcess, TestDaemon, request

from laxflow.coordinator.client import request_status
from laxflow.protocol import messages as m


@pytest.fixture
def coordinator(tmp_path):
    c = CoordinatorProcess(tmp_path).start()
    yield c
    c.stop()


@pytest.fixture
def daemons(coordinator):
    ds = [TestDaemon(coordinator.address, f"n{i}", [f"n{i}/p0"]) for i in range(3)]
    yield ds
    for d in ds:
        d.close()


def wait_status(address, predicate, timeout=15.0, keys=None):
    deadline = time.monotonic() + timeout
    while True:
        s = request_status(address, keys=keys, timeout_s=2.0)
        if predicate(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def test_decisions_reach_every_daemon_in_red_order_with_pruning(coordinator, daemons):
    n0, n1, n2 = daemons
    now = time.time()
    # Two batches compete for port n1/p0 (1 GB/s): RED puts the tighter one first.
    n0.arrive(m.BatchInfo("late", 0.0, (request("late-r", now + 30, 0.1 * GB, "n0/p0", "n1/p0"),)))
    n2.arrive(m.BatchInfo("soon", 0.0, (request("soon-r", now + 20, 0.1 * GB, "n2/p0", "n1/p0"),)))
    want = ["soon", "late"]
    for d in daemons:  # PUB reaches all three, including n1 which reported nothing
        d.wait_for(lambda dec: [r.batch_id for r in dec.order] == want)
    # An infeasible batch: its heaviest request on the bottleneck is pruned, the batch stays ordered.
    n1.arrive(m.BatchInfo("doomed", 0.0, (request("big", now + 1.0, 5 * GB, "n1/p0", "n0/p0"),
                                          request("small", now + 1.2, 0.01 * GB, "n1/p0", "n0/p0"))))
    dec = n0.wait_for(lambda dec: "big" in dec.pruned)
    assert [r.batch_id for r in dec.order][0] == "doomed" and dec.pruned == ("big",)
    assert all(w.coordinator_id == dec.coordinator_id for d in daemons for w in d.welcomes)
    n1.depart("doomed")
    n0.wait_for(lambda dec: dec.pruned == () and len(dec.order) == 2)

    s = wait_status(coordinator.address, lambda s: all(d.queues for d in s.daemons))
    assert [d.node for d in s.daemons] == ["n0", "n1", "n2"] and all(d.alive for d in s.daemons)
    assert (s.active_batches, s.active_requests) == (2, 2)
    assert [b.id for b in s.batches] == ["soon", "late"]
    assert s.latency.count >= 3 and s.latency.max > 0

    metrics = coordinator.metrics()
    assert metrics["laxflow_coordinator_daemons_alive"] == 3
    assert metrics["laxflow_coordinator_active_batches"] == 2
    assert metrics["laxflow_coordinator_pruned_total"] == 1
    assert metrics["laxflow_coordinator_decision_seconds_count"] >= 3
    assert metrics["laxflow_coordinator_frames_total{type=batch_arrival}"] == 3


def test_status_cli_json_and_table(coordinator, daemons):
    wait_status(coordinator.address, lambda s: len(s.daemons) == 3)
    out = subprocess.run([LAXFLOW, "status", "--coordinator", coordinator.address, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["node"] for d in data["daemons"]] == ["n0", "n1", "n2"]
    assert set(data["latency"]) == {"count", "last", "p50", "p99", "max"}
    table = subprocess.run([LAXFLOW, "status", "--coordinator", coordinator.address],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "n2/p0" in table.stdout and "decision latency" in table.stdout


def test_status_without_coordinator_is_one_line(tmp_path):
    from cptest import free_port

    out = subprocess.run([LAXFLOW, "status", "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.3"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no coordinator answered" in out.stderr


def test_kill9_and_restart_rebuilds_the_view(tmp_path):
    c = CoordinatorProcess(tmp_path).start()
    ds = [TestDaemon(c.address, f"n{i}", [f"n{i}/p0"]) for i in range(3)]
    try:
        now = time.time()
        for i, d in enumerate(ds):
            d.arrive(m.BatchInfo(f"b{i}", 0.0, (request(f"r{i}", now + 10 + i, 1e6, f"n{i}/p0", "n0/p0"),)))
        before = ds[0].wait_for(lambda dec: len(dec.order) == 3)
        c.kill9()
        time.sleep(0.3)
        c.start()  # same ports, empty memory
        s = wait_status(c.address, lambda s: s.active_batches == 3 and len(s.daemons) == 3)
        assert [d.node for d in s.daemons] == ["n0", "n1", "n2"] and s.active_batches == 3
        assert s.coordinator_id != before.coordinator_id
        after = ds[1].wait_for(lambda dec: dec.coordinator_id == s.coordinator_id and len(dec.order) == 3)
        assert [r.batch_id for r in after.order] == [r.batch_id for r in before.order]
        assert all(d.resyncs >= 1 for d in ds)
    finally:
        for d in ds:
            d.close()
        c.stop()


def test_silent_daemon_is_declared_dead(coordinator):
    a = TestDaemon(coordinator.address, "alive", ["alive/p0"])
    b = TestDaemon(coordinator.address, "mute", ["mute/p0"])
    try:
        b.arrive(m.BatchInfo("mb", 0.0, (request("mr", time.time() + 5, 1.0, "mute/p0", "alive/p0"),)))
        a.wait_for(lambda dec: [r.batch_id for r in dec.order] == ["mb"])
        b.close()  # stops beating
        dec = a.wait_for(lambda dec: dec.order == () and "dead mute" in dec.trigger)
        assert dec.order == ()
    finally:
        a.close()


def test_sigterm_exits_zero(tmp_path):
    c = CoordinatorProcess(tmp_path).start()
    assert c.stop() == 0


def test_refuses_public_bind_without_keys():
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", "tcp://0.0.0.0:1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--curve-keys" in out.stderr and out.stderr.count("\n") == 1
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", "udp://x"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "expected tcp://HOST:PORT" in out.stderr


def test_port_in_use_is_one_line(coordinator):
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", coordinator.address], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "cannot bind" in out.stderr and out.stderr.count("\n") == 1
    from cptest import free_port

    other = f"tcp://127.0.0.1:{free_port(pair=True)}"
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", other, "--metrics-port", str(coordinator.metrics_port)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "cannot serve metrics" in out.stderr


def test_fresh_coordinator_says_no_decision_yet_and_that_anyone_local_can_register(coordinator):
    table = subprocess.run([LAXFLOW, "status", "--coordinator", coordinator.address],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    assert "no decision yet" in table.stdout and "#-1" not in table.stdout, table.stdout
    assert "auth: none (any local process can register" in table.stdout, table.stdout
    out = subprocess.run([LAXFLOW, "status", "--coordinator", coordinator.address, "--json"],
                         capture_output=True, text=True, timeout=30)
    data = json.loads(out.stdout)
    assert "seq" in data and data["seq"] is None  # documented: null until the first decision
    assert data["auth"] == "none-loopback" and data["handshake_failures"] == {"auth": 0, "protocol": 0, "other": 0}


def test_dead_daemon_is_shown_dead_with_its_last_seen_age(coordinator, daemons):
    wait_status(coordinator.address, lambda s: len(s.daemons) == 3)
    daemons[1].close()  # n1 stops beating (dead after 1 s)
    s = wait_status(coordinator.address, lambda s: not s.daemons[1].alive)
    assert [(d.node, d.alive) for d in s.daemons] == [("n0", True), ("n1", False), ("n2", True)]
    out = subprocess.run([LAXFLOW, "status", "--coordinator", coordinator.address, "--json"],
                         capture_output=True, text=True, timeout=30)
    n1 = json.loads(out.stdout)["daemons"][1]
    assert (n1["node"], n1["alive"], n1["state"]) == ("n1", False, "dead")
    assert n1["heartbeat_age"] >= 1.0 and n1["last_seen"] == pytest.approx(time.time() - n1["heartbeat_age"], abs=5)
    table = subprocess.run([LAXFLOW, "status", "--coordinator", coordinator.address],
                           capture_output=True, text=True, timeout=30)
    assert "n1: dead, last seen" in table.stdout and "s ago" in table.stdout, table.stdout


def test_forget_after_flag(tmp_path):
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", "tcp://127.0.0.1:1", "--dead-after", "5", "--forget-after", "1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "forget-after" in out.stderr and out.stderr.count("\n") == 1, out.stderr
