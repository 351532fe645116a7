"""NCCL: the profiler plugin loaded as NCCL loads it, and what `laxflow run` sets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from segment_daemon import SegmentDaemon

from laxflow.adapters.nccl import apply_run_env, collective_tc
from laxflow.protocol.shm import EventKind, Stage

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "native" / "nccl_profiler"
LAXFLOW = shutil.which("laxflow") or str(Path(sys.executable).parent / "laxflow")

needs_cc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("make") is None, reason="needs gcc and make")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    out = tmp_path_factory.mktemp("nccl_profiler")
    subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR), f"OUT={out}"], check=True)
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", "-o", str(out / "harness"),
                    str(PLUGIN_DIR / "harness.c"), "-ldl"], check=True)
    return out / "libnccl-profiler-laxflow.so", out / "harness"


def run_harness(plugin, version: str, shm_name: str) -> str:
    lib, harness = plugin
    env = {**os.environ, "LAXFLOW_SHM_NAME": shm_name}
    res = subprocess.run([str(harness), str(lib), version], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout


@needs_cc
@pytest.mark.parametrize("version", ["v6", "v5"])
def test_plugin_reports_collective_start_and_stop(plugin, version):
    daemon = SegmentDaemon(lambda ev: None)
    try:
        out = run_harness(plugin, version, daemon.name)
        assert "name=laxflow mask=2" in out  # ncclProfileColl only
        assert "coll0 handle=set" in out and "coll1 handle=set" in out and "group handle=null" in out
        daemon.wait_for(lambda evs: len(evs) == 4)
        time.sleep(0.02)
        evs = daemon.events
        assert [e["kind"] for e in evs] == [EventKind.SUBMIT, EventKind.COMPLETION] * 2
        assert [e["bytes"] for e in evs] == [4096, 4096, 2048, 2048]  # 1024 x float32, x bfloat16
        assert [e["layer"] for e in evs] == [7, 7, 8, 8]  # the collective's sequence number
        assert all(e["stage"] == Stage.COLLECTIVE and e["request_id"] == 0xC0FFEE for e in evs)
        assert evs[0]["msg_id"] == evs[1]["msg_id"] != evs[2]["msg_id"] == evs[3]["msg_id"]
    finally:
        daemon.close()


@needs_cc
def test_plugin_is_inert_without_daemon(plugin):
    out = run_harness(plugin, "v6", f"/lxf-adapters-none-{os.getpid()}")
    assert "mask=0" in out and "coll0 handle=null" in out


def test_run_env_defaults_and_user_values():
    env: dict[str, str] = {}
    apply_run_env(env)
    assert env["NCCL_IB_TC"] == str(38 << 2)  # collective level 1 of the default 8-level map
    assert env["LAXFLOW_DEFAULT_STAGE"] == "2"
    env = {"NCCL_IB_TC": "96"}
    apply_run_env(env, dscp=10)
    assert env["NCCL_IB_TC"] == "96"
    assert collective_tc(10) == 40


def test_laxflow_run_sets_nccl_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LAXFLOW_"))}
    res = subprocess.run([LAXFLOW, "run", "--dscp", "10", "--collectives", "nccl", "--", "env"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert got["NCCL_IB_TC"] == "40" and got["LAXFLOW_DEFAULT_STAGE"] == "2" and got["LAXFLOW_DSCP"] == "10"
    assert "liblaxflow_shim.so" in got["LD_PRELOAD"]
    if (ROOT / "src" / "laxflow" / "_native" / "libnccl-profiler-laxflow.so").is_file():
        assert got["NCCL_PROFILER_PLUGIN"].endswith("libnccl-profiler-laxflow.so")
