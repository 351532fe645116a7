"""Mooncake through laxflow's wrapper between two testbed hosts (root only).

A 2-host fabric (100 Mbit/s, strict-priority HTB queues by DSCP) with a
real ``laxflow daemon`` in h0's namespace (its one port with a zero permit
window and no spare-capacity grant: a lower-level message waits until the
higher ones' bytes are done), a
plain Mooncake target in h1, and the initiator in h0 under the laxflow shim
using ``laxflow.adapters.mooncake.TransferEngine`` (mc_tb_initiator.py).
Checked: the bytes on both sides (sha256), the DSCP of every data byte the
initiator's connection put on the switch port equals its transfer's permit
(the first contact's 4 KiB primer aside), the permits' queues on the switch
port counted packets, and a low-level read announced before a second
high-level write got its permit only after both writes were acknowledged.

What is not checked: the class of the bytes h1 sends (a READ's data, the
ACKs of a WRITE).  They leave from the target's sockets, which no laxflow
process marks here; a deployment runs the target under laxflow as well.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from laxflow.adapters.mooncake import PRIME_BYTES
from laxflow.policy.dscp import default_dscp_map
from laxflow.shim import ShimConfig, shim_env
from laxflow.testbed.fabric import FabricConfig, Testbed, existing_namespaces, parse_rate, tc_of_dscp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="testbed needs root (network namespaces and qdiscs)")
pytest.importorskip("mooncake.engine", reason="extra 'mooncake' not installed")
pytest.importorskip("scapy.all")

HERE = Path(__file__).parent
RATE = "100mbit"
SIZE = 12 << 20  # both buffers; the initiator's REGIONS fit in it
LATE_MARK_BYTES = 256 << 10
LAXFLOW = [sys.executable, "-c", "from laxflow.cli import main; main()"]


def _start_daemon(tb: Testbed, tmp: str, shm: str, hooks: str) -> subprocess.Popen:
    ports = os.path.join(tmp, "ports.json")
    rate = parse_rate(RATE) / 8
    with open(ports, "w") as f:
        json.dump({"ports": [{"name": "eth0", "rate": rate, "counter": "/sys/class/net/eth0/statistics/tx_bytes"}]}, f)
    conf = os.path.join(tmp, "daemon.json")
    with open(conf, "w") as f:
        # Strict priority without overlap: a lower level waits for the bytes above. (The default also grants
        # into spare capacity, when the port's counter shows it idle for a while: a write stalled that long on
        # a loaded machine would let the read go early. tests/daemon/test_daemon_core.py covers that rule.)
        json.dump({"window_bytes": 0, "spare_share": None}, f)
    log = open(os.path.join(tmp, "daemon.log"), "w")
    proc = tb.popen_in(0, [*LAXFLOW, "daemon", "--config", conf, "--node", "h0", "--shm", shm, "--ports", ports,
                           "--hooks", hooks, "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 30
    while not (os.path.exists(f"/dev/shm{shm}") and os.path.exists(hooks[len("ipc://"):])):
        assert proc.poll() is None and time.monotonic() < deadline, open(os.path.join(tmp, "daemon.log")).read()
        time.sleep(0.05)
    return proc


def _ask(proc: subprocess.Popen, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_mooncake_through_the_adapter_between_testbed_hosts():
    name = f"mc{os.getpid() % 100000}"
    tb = Testbed(FabricConfig(hosts=2, rate=RATE, name=name))
    tmp = tempfile.mkdtemp(prefix=f"laxflow-{name}-")
    shm, hooks = f"/{name}-h0-{os.getpid()}", f"ipc://{tmp}/hooks.sock"
    procs: list[subprocess.Popen] = []
    tb.up()
    try:
        procs.append(_start_daemon(tb, tmp, shm, hooks))
        target = tb.popen_in(1, [sys.executable, str(HERE / "mc_tb_target.py"), tb.address(1), str(SIZE)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        procs.append(target)
        info = json.loads(target.stdout.readline())
        capture = tb.popen_in("sw", [sys.executable, str(HERE / "mc_tb_capture.py"), "p0", "p1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(capture)
        assert capture.stdout.readline().strip() == "ready"
        before = tb.class_packets("sw", "p1")

        spec = {"local": tb.address(0), "target": f"{tb.address(1)}:{info['port']}", "addr": info["addr"],
                "shm": shm, "hooks": hooks}
        res = tb.exec_in(0, [sys.executable, str(HERE / "mc_tb_initiator.py"), json.dumps(spec)],
                         env=shim_env(ShimConfig(shm_name=shm)), timeout=240)
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout.strip().splitlines()[-1])
        wire = json.loads(_ask(capture, ""))
        after = tb.class_packets("sw", "p1")

        # bytes: what the initiator holds equals what the target holds, region by region
        for region, (off, n) in out["regions"].items():
            assert _ask(target, f"{off} {n}") == out["sha"][region], f"{region}: bytes differ"

        # every transfer ran under its own permit from the daemon
        recs = {r["request"]: r for r in out["records"]}
        summary = {k: (r["op"], r["level"], r["dscp"], round(r["permitted"] - out["submitted"]["h1"], 4),
                       round(r["done"] - out["submitted"]["h1"], 4)) for k, r in recs.items()}
        print("permits (op, level, dscp, permitted, done; s after H3's submit):", summary)
        assert sorted(recs) == [1, 2, 3, 4, 5] and all(r["status"] == 0 and r["msg_id"] > 0 for r in recs.values()), summary
        assert out["gate"]["failopen"] == 0 and out["gate"]["bypassed"] == 0, out["gate"]
        assert all(r["drained"] for r in recs.values() if r["op"] == "write"), summary

        # ordering: L (read, far layer) was announced before H5, yet waited for H3's and H5's bytes
        h3, low, h5 = recs[3], recs[4], recs[5]
        assert low["level"] > max(h3["level"], h5["level"]), summary
        assert out["submitted"]["l4"] < out["submitted"]["h5"] < h3["done"], (out["submitted"], recs)
        assert low["permitted"] >= max(h3["done"], h5["done"]), summary
        assert h5["permitted"] < low["permitted"]

        # DSCP on the wire: the initiator's data bytes, leaving the switch towards h1, in their permit's class
        sent: dict[int, int] = {}
        for src, sport, dst, dport, dscp, nbytes in wire["flows"]:
            if src == tb.address(0) and dport == out["data_port"] and sport in out["local_ports"] and nbytes:
                sent[dscp] = sent.get(dscp, 0) + nbytes
        assert wire["drops"] == 0
        h0_flows = [f for f in wire["flows"] if f[0] == tb.address(0) and f[5]]
        written: dict[int, int] = {}
        for r in recs.values():
            written[r["dscp"]] = written.get(r["dscp"], 0) + (r["nbytes"] if r["op"] == "write" else 17)
        assert set(sent) - {0} == set(written), (sent, written, h0_flows)
        # the first contact's primer and its header; the first packets of the connection Mooncake opens for
        # the overlapping H5, when its I/O thread connects it after the submit (marked once it appears)
        assert sent.get(0, 0) <= PRIME_BYTES + 64 + LATE_MARK_BYTES, (sent, h0_flows)
        for dscp, nbytes in written.items():
            assert sent[dscp] >= nbytes - PRIME_BYTES - LATE_MARK_BYTES, (dscp, sent, written, h0_flows)
        # and they went through the switch port's queue of that class
        tc = tc_of_dscp(default_dscp_map(tb.config.levels))
        for dscp in written:
            assert after.get(tc[dscp], 0) > before.get(tc[dscp], 0), (dscp, before, after)
        print(json.dumps({"write_acked_after_mooncake_done_s": {k: round(r["done"] - r["moved"], 4) for k, r in recs.items()
                                                                if r["op"] == "write"},
                          "sent_bytes_by_dscp": sent, "permits": {k: (r["level"], r["dscp"]) for k, r in recs.items()},
                          "h1_to_h0_bytes_by_dscp": _by_dscp(wire, tb.address(1))}))
    finally:
        for p in procs:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        tb.down()
        try:
            os.unlink(f"/dev/shm{shm}")
        except FileNotFoundError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    assert not [ns for ns in existing_namespaces() if ns.startswith(f"{name}-")]


def _by_dscp(wire: dict, src_addr: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for src, _sport, _dst, _dport, dscp, nbytes in wire["flows"]:
        if src == src_addr:
            out[dscp] = out.get(dscp, 0) + nbytes
    return out
