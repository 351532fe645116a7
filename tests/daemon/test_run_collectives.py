"""``laxflow run --collectives nccl|gloo``: only a job that says it runs collectives gets the collective env.

Before, ``laxflow run`` set ``LAXFLOW_DEFAULT_STAGE=2`` and the NCCL variables for every job, so every untagged
TCP socket of a Mooncake target became a stream of stage-2 messages that the daemon granted in the collective
class (DSCP 38 on the wire). Here a real ``laxflow daemon`` schedules a job under ``laxflow run``; the job makes
one untagged TCP connection and writes to it, and the DSCP its packets carry on lo is read by a packet capture.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest
from daemontest import LAXFLOW

from laxflow.protocol.shm import Segment
from laxflow.testbed.capture import SO_ATTACH_FILTER, SO_RCVBUFFORCE, _drops, _SockFilter, _SockFprog

COLLECTIVE_ENV = ("LAXFLOW_DEFAULT_STAGE", "NCCL_IB_TC", "NCCL_PROFILER_PLUGIN")

# One untagged TCP connection from source port argv[1]; 20 writes, each read in full by the peer and 20 ms apart
# (so the permit the daemon writes for one write is in place before the next, as for request/response traffic).
JOB = r"""
import json, os, socket, sys, time
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.connect(ls.getsockname()); c, _ = ls.accept()
for _ in range(20):
    s.sendall(b"x" * 65536)
    got = 0
    while got < 65536:
        got += len(c.recv(65536))
    time.sleep(0.02)
print(json.dumps({"tos": s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS),
                  "env": {k: os.environ[k] for k in %r if k in os.environ}}))
""" % (COLLECTIVE_ENV,)


class PortCapture:
    """Headers of the IPv4 TCP packets lo sends from source ``port``, filtered in the kernel (classic BPF), so
    the rest of the machine's loopback traffic neither fills the buffer nor costs parsing."""

    def __init__(self, port: int) -> None:
        prog = (_SockFilter * 9)(
            _SockFilter(0x28, 0, 0, 12), _SockFilter(0x15, 0, 6, 0x0800),  # ethertype IPv4, else drop
            _SockFilter(0x30, 0, 0, 23), _SockFilter(0x15, 0, 4, 6),  # protocol TCP, else drop
            _SockFilter(0xB1, 0, 0, 14), _SockFilter(0x48, 0, 0, 14),  # X = IP header length; A = TCP source port
            _SockFilter(0x15, 0, 1, port), _SockFilter(0x06, 0, 0, 256), _SockFilter(0x06, 0, 0, 0),
        )
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self._prog = prog
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                             bytes(memoryview(_SockFprog(9, ctypes.cast(prog, ctypes.POINTER(_SockFilter)))).cast("B")))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        self.sock.bind(("lo", 0x0003))
        self.sock.setblocking(False)

    def stop(self) -> tuple[dict[int, int], int]:
        """Payload bytes per DSCP, and the packets the kernel dropped."""
        sent: dict[int, int] = {}
        try:
            while True:
                try:
                    data, addr = self.sock.recvfrom(256)
                except BlockingIOError:
                    break
                if addr[2] != socket.PACKET_OUTGOING:  # lo shows each packet twice: count it leaving
                    continue
                ihl = (data[14] & 0xF) * 4
                total = struct.unpack_from("!H", data, 16)[0]
                payload = total - ihl - (data[14 + ihl + 12] >> 4) * 4
                if payload > 0:
                    sent[data[15] >> 2] = sent.get(data[15] >> 2, 0) + payload
            return sent, _drops(self.sock)
        finally:
            self.sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(daemon, *flags: str) -> tuple[dict, dict[int, int], dict[str, int]]:
    """The job under ``laxflow run FLAGS``: its report, payload bytes per DSCP on the wire, the segment's counters."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "NCCL_", "LD_PRELOAD"))}
    port = _free_port()
    capture = PortCapture(port)
    try:
        res = subprocess.run([*LAXFLOW, "run", "--shm-name", daemon.shm, *flags, "--", sys.executable, "-c", JOB,
                              str(port)], env=env, capture_output=True, text=True, timeout=120)
        time.sleep(0.2)
    finally:
        sent, drops = capture.stop()
    assert drops == 0
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    seg = Segment.attach(daemon.shm)
    try:
        counters = seg.counters()
    finally:
        seg.close(unlink=False)
    return out, sent, counters


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
def test_a_job_without_collectives_gets_no_collective_env_and_dscp_0(start_daemon):
    daemon = start_daemon()
    out, sent, counters = _run_job(daemon)
    assert sent == {0: 20 * 65536}, sent  # not 38, the collective class
    assert out["env"] == {}, out["env"]
    assert out["tos"] == 0 and counters["sock_msgs"] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")
def test_an_nccl_job_gets_the_collective_class(start_daemon):
    daemon = start_daemon()
    out, sent, counters = _run_job(daemon, "--collectives", "nccl")
    assert out["env"]["LAXFLOW_DEFAULT_STAGE"] == "2" and out["env"]["NCCL_IB_TC"] == str(38 << 2)
    assert counters["sock_msgs"] == 20  # each untagged write a stage-2 message
    # a write takes the class of the permit its predecessor got, if the shim saw that permit before the daemon
    # cleared it at the write's COMPLETION: a request/response write submits and completes within microseconds, so
    # whether any permit is seen is a race with the daemon's wake-up (seen once, the class sticks). What is fixed:
    # nothing leaves in any class but unclassed or the collective one.
    assert set(sent) <= {0, 38} and sum(sent.values()) == 20 * 65536, sent
    assert out["tos"] in (0, 38 << 2)  # the class the last permit it saw gave, if any (see above)


def test_gloo_gets_the_default_stage_only_and_a_bad_value_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "NCCL_", "LD_PRELOAD"))}
    show = [sys.executable, "-c", f"import json, os; print(json.dumps({{k: os.environ[k] for k in {COLLECTIVE_ENV!r} "
                                  "if k in os.environ}))"]
    for flags, want in (([], {}), (["--collectives", "gloo"], {"LAXFLOW_DEFAULT_STAGE": "2"})):
        res = subprocess.run([*LAXFLOW, "run", "--dscp", "10", *flags, "--", *show], env=env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.strip().splitlines()[-1]) == want
    res = subprocess.run([*LAXFLOW, "run", "--collectives", "mpi", "--", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--collectives" in res.stderr and "nccl" in res.stderr and "gloo" in res.stderr
