"""``laxflow run -- CMD``: finds the node's daemon, or starts one embedded for this node alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from daemontest import LAXFLOW

from laxflow.protocol.shm import Segment, SegmentError

CHILD = r"""
import json, os, sys
from laxflow.protocol.shm import Segment
from laxflow.hooks import HooksClient
seg = Segment.attach(os.environ["LAXFLOW_SHM_NAME"])
with HooksClient() as h:
    st = h.status()
print(json.dumps({"live": seg.live(), "preload": os.environ.get("LD_PRELOAD", ""),
                  "mode": st.mode if st else None, "ports": list(st.ports) if st else None}))
seg.close(unlink=False)
sys.exit(3)
"""


def _run(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAXFLOW_")}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # default hooks address under the test's own directory
    return subprocess.run([*LAXFLOW, "run", *args], capture_output=True, text=True, timeout=120, env=env)


def test_run_without_a_daemon_starts_one_embedded_and_cleans_up(tmp_path):
    shm = f"/lxf-run-{os.getpid()}"
    ports = tmp_path / "ports.json"
    ports.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 100}]}))
    out = _run(["--shm-name", shm, "--ports", str(ports), "--", sys.executable, "-c", CHILD], tmp_path)
    assert out.returncode == 3, out.stderr  # the command's own status
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["live"] and "liblaxflow_shim.so" in seen["preload"]
    assert (seen["mode"], seen["ports"]) == ("local", ["eth0"])
    assert "started an embedded daemon" in out.stderr
    try:
        Segment.attach(shm).close(unlink=False)
        raise AssertionError("the embedded daemon's segment outlived the command")
    except SegmentError:
        pass


def test_run_uses_the_live_daemon(tmp_path, start_daemon):
    d = start_daemon()
    env_hooks = d.hooks
    out = subprocess.run([*LAXFLOW, "run", "--shm-name", d.shm, "--", sys.executable, "-c", CHILD], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "LAXFLOW_HOOKS": env_hooks})
    assert out.returncode == 3, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["live"] and seen["mode"] == "local"
    assert "embedded" not in out.stderr
    assert d.proc.poll() is None  # the node's daemon keeps running


def test_run_bad_input_is_one_line(tmp_path):
    out = _run(["--shm-name", "bad", "--", "true"], tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--shm-name" in out.stderr
    out = _run(["--shm-name", f"/lxf-run-none-{os.getpid()}", "--ports", "auto", "--", "/nonexistent-cmd"], tmp_path)
    assert out.returncode == 2 and "command not found" in out.stderr
