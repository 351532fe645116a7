"""LAXFLOW_DEFAULT_STAGE: untagged QPs and TCP sockets of an NCCL/Gloo job
(`laxflow run` sets 2) are reported to a live daemon as stage-2 messages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from shimtest import Client, client_env, log_by_qp, run_client

from laxflow.protocol.shm import EventKind, Gate, Stage

FLOW = """
import os, socket, sys
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
s = socket.create_connection(ls.getsockname()); c, _ = ls.accept()
print(os.getpid(), s.fileno(), c.fileno(), flush=True)
for line in sys.stdin:
    how, n = line.split(); n = int(n)
    if how == "send":
        s.sendall(b"a" * n)
    elif how == "writev":
        os.writev(s.fileno(), [b"e" * (n // 3), b"f" * (n - n // 3)])
    elif how == "file":
        with open(os.devnull, "wb") as f:
            f.write(b"z" * n)
    got = 0
    while how != "file" and got < n:
        got += len(c.recv(65536))
    print(s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS), flush=True)
"""


def run_flow(shim_lib, daemon, default_stage: str | None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
    env.update(LD_PRELOAD=str(shim_lib), LAXFLOW_SHM_NAME=daemon.name)
    if default_stage is not None:
        env["LAXFLOW_DEFAULT_STAGE"] = default_stage
    return subprocess.Popen([sys.executable, "-c", FLOW], env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)


def step(proc, how: str, n: int) -> int:
    proc.stdin.write(f"{how} {n}\n")
    proc.stdin.flush()
    return int(proc.stdout.readline())


def test_untagged_socket_writes_are_stage2_messages_with_the_permits_class(shim_lib, daemon):
    """Each untagged write of a default-stage process is a SUBMIT (stage 2,
    its bytes) and a COMPLETION; the socket takes the class the daemon's
    permit gave its previous message; writes to files stay invisible."""
    proc = run_flow(shim_lib, daemon, "2")
    try:
        pid, fd, peer = map(int, proc.stdout.readline().split())
        daemon.seg.drain_events()
        assert step(proc, "send", 3000) == 0
        ev = daemon.seg.drain_events()
        sub = ev[ev["kind"] == EventKind.SUBMIT]
        comp = ev[ev["kind"] == EventKind.COMPLETION]
        assert sub["stage"].tolist() == [Stage.COLLECTIVE] and sub["bytes"].tolist() == [3000]
        assert sub["handle"].tolist() == [fd] and sub["pid"].tolist() == [pid]
        assert comp["msg_id"].tolist() == sub["msg_id"].tolist()
        # the daemon grants it in the collective class: the next message carries it
        daemon.seg.set_permit(int(sub["msg_id"][0]), Gate.OPEN, level=1, dscp=38)
        assert step(proc, "writev", 1500) == 38 << 2
        ev = daemon.seg.drain_events()
        sub = ev[ev["kind"] == EventKind.SUBMIT]
        assert sub["stage"].tolist() == [Stage.COLLECTIVE] and sub["bytes"].tolist() == [1500]
        assert len(ev[ev["kind"] == EventKind.COMPLETION]) == 1
        assert step(proc, "file", 500) == 38 << 2
        assert len(daemon.seg.drain_events()) == 0
        assert daemon.seg.counters()["sock_msgs"] == 2
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert proc.returncode == 0


def test_without_default_stage_untagged_sockets_pass_through(shim_lib, daemon):
    proc = run_flow(shim_lib, daemon, None)
    try:
        proc.stdout.readline()
        daemon.seg.drain_events()
        assert step(proc, "send", 3000) == 0
        assert len(daemon.seg.drain_events()) == 0
    finally:
        proc.stdin.close()
        proc.wait(30)


@pytest.mark.parametrize("mode", ["direct", "ex"])
def test_untagged_qp_is_a_gated_stage2_message(native_bin, shim_lib, tmp_path, daemon, mode):
    """An untagged QP of a default-stage process is one stage-2 message: SUBMIT
    once, its WRs wait for the permit, then reach the device unchanged."""
    args = [mode, "2", "20", "1"]
    ref_log = tmp_path / "ref.log"
    assert run_client(native_bin, args, client_env(native_bin, ref_log)).returncode == 0
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"],
                    client_env(native_bin, log, shim_lib, daemon.name, LAXFLOW_DEFAULT_STAGE="2"))
    pid, qps = client.qps()
    client.plan(2, 1)
    daemon.seg.drain_events()
    client.send()
    client.expect("POSTED 0")
    ev = daemon.seg.drain_events()
    sub = ev[ev["kind"] == EventKind.SUBMIT]
    assert sorted(sub["handle"].tolist()) == sorted(qps)
    assert set(sub["stage"].tolist()) == {Stage.COLLECTIVE} and set(sub["pid"].tolist()) == {pid}
    assert daemon.seg.counters()["wr_deferred"] > 0
    for m in sub["msg_id"].tolist():
        daemon.seg.set_permit(int(m), Gate.OPEN, level=1, dscp=38)
    assert client.wait() == 0, client.proc.stderr.read()
    assert log_by_qp(log) == log_by_qp(ref_log)
    assert daemon.seg.counters()["wr_failopen"] == 0
