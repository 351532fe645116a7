"""The soak benchmark's two minutes in CI, and its cleanup when interrupted.

``bench/soak.py --minutes 2 --json`` runs the loopback cluster (a coordinator,
two daemons, a Mooncake target and initiator under ``laxflow run``) under
byte-verified Mooncake and socket traffic, killing daemon n0 and the
coordinator with SIGKILL and restarting them. Asserted: behaviour (nothing
lost, nothing failed, kills happened and the view came back, memory and
descriptors of the processes that lived through the run did not grow past a
generous bound after warm-up, every /dev/shm entry it made is gone, every
process exited 0 on SIGTERM at the end). Timings are reported, not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mooncake.engine", reason="extra 'mooncake' not installed")

SOAK = Path(__file__).parents[1] / "bench" / "soak.py"
RSS_GROWTH_BOUND_KIB = 64 << 10  # generous: a leak of a segment mapping or a buffer per restart/iteration shows
FD_GROWTH_BOUND = 4


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_two_minute_soak_loses_nothing_and_leaks_nothing():
    res = subprocess.run([sys.executable, str(SOAK), "--minutes", "2", "--json"], capture_output=True, text=True,
                         timeout=400)
    r = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in r.items() if k != "processes"}))
    assert res.returncode == 0 and r["errors"] == 0, (r["error_samples"], res.stderr[-3000:])
    assert r["iterations"] > 0 and r["bytes_verified"] == r["iterations"] * r["msg_bytes"]
    assert r["socket_bytes_verified"] > 0 and r["hooks_batches"] > 0 and r["hooks_errors"] == 0
    # every transfer announced to a daemon completed (granted, failed open or passed through): none lost
    gate = r["gate"]
    assert gate["submitted"] == gate["completed"] == 2 * r["iterations"], gate
    assert r["kills"]["daemon"] >= 1 and r["kills"]["coordinator"] >= 1, r["kills"]
    assert r["restarts"] == r["kills"]
    assert r["view_rebuild_s"] and None not in r["view_rebuild_s"]
    assert r["segment_counters"]["n0"]["reattaches"] >= 1  # the initiator's shim followed the new segment
    assert r["ring_drops"] == {"n0": 0, "n1": 0}
    assert r["exit_codes"] == {"initiator": 0, "target": 0, "daemon-n0": 0, "daemon-n1": 0, "coordinator": 0}
    assert r["shm"]["peak"] > r["shm"]["start"] and r["shm"]["ours_left"] == []
    long_lived = 0
    for name, incarnations in r["processes"].items():
        for inc in incarnations:
            assert not _pid_alive(inc["pid"]), f"{name} pid {inc['pid']} outlived the soak"
            if inc["warm_span_s"] >= 30:  # lived long enough past warm-up to judge
                long_lived += 1
                assert inc["rss_growth_kib"] < RSS_GROWTH_BOUND_KIB, (name, inc)
                assert inc["fds_end"] <= inc["fds_warm"] + FD_GROWTH_BOUND, (name, inc)
                # a job keeps at most one mapping of each replaced segment (not one per re-attach attempt)
                assert inc["shm_maps_end"] <= inc["shm_maps_warm"] + r["kills"]["daemon"], (name, inc)
    assert long_lived >= 3  # daemon n1, the target and the initiator at least


def test_interrupted_soak_kills_its_processes_and_removes_its_segments():
    proc = subprocess.Popen([sys.executable, str(SOAK), "--minutes", "5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # progress lines; wait until traffic runs
            if "cluster up" in line:
                break
            assert time.monotonic() < deadline, "soak never came up"
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    r = json.loads(out)
    assert proc.returncode == 1 and any("interrupted" in e for e in r["error_samples"]), r["error_samples"]
    assert r["shm"]["peak"] > r["shm"]["start"] and r["shm"]["ours_left"] == []
    pids = [inc["pid"] for incs in r["processes"].values() for inc in incs]
    assert len(pids) == 5
    assert not [p for p in pids if _pid_alive(p)]
    tag = f"lxf-soak-{proc.pid}"
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(tag)]
