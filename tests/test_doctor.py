"""``laxflow doctor`` run for real on this machine (a ``laxflow`` process), plus its ports check on a fake sysfs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laxflow.doctor import check_ports, check_user

LAXFLOW = str(Path(sys.executable).with_name("laxflow"))


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([LAXFLOW, "doctor", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def checks(done: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def _sysfs_has_speed() -> bool:
    for dev in Path("/sys/class/net").iterdir():
        try:
            if dev.name != "lo" and int((dev / "speed").read_text()) > 0:
                return True
        except (OSError, ValueError):
            pass
    return False


def test_this_node_the_shim_loads_and_the_ports_check_matches_sysfs():
    done = doctor("--json")
    got = checks(done)
    assert list(got) == ["shim", "ports", "shm", "env", "dscp"]
    assert got["shim"]["status"] == "ok" and "liblaxflow_shim.so" in got["shim"]["found"]
    assert got["shm"]["status"] == "ok"
    if _sysfs_has_speed():
        assert got["ports"]["status"] == "ok"
    else:  # this VM: virtio reports speed -1
        assert got["ports"]["status"] == "warn"
        assert "speed -1" in got["ports"]["found"] and "--line-rate GBPS" in got["ports"]["todo"]
    assert done.returncode == 0 and json.loads(done.stdout)["failed"] == 0
    lines = doctor().stdout.splitlines()  # the text form: one line per check, status first
    assert [ln.split()[:2] for ln in lines] == [[c["status"], name] for name, c in got.items()]


def test_a_ports_file_passes_and_a_bad_one_fails(tmp_path):
    good = tmp_path / "ports.json"
    good.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 100}]}))
    got = checks(doctor("--json", "--ports", str(good)))
    assert got["ports"]["status"] == "ok" and "eth0 100 Gbit/s" in got["ports"]["found"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    done = doctor("--json", "--ports", str(bad))
    assert checks(done)["ports"]["status"] == "fail" and done.returncode == 1


def test_ports_auto_on_a_nic_without_speed_and_one_with(tmp_path):
    for name, speed in (("lo", "-1"), ("eth0", "-1")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(speed + "\n")
    (tmp_path / "ifb0").mkdir()  # no speed file: a virtual interface, not listed
    c = check_ports("auto", tmp_path)
    assert (c.status, c.found) == ("warn", "sysfs: no link speed (eth0 speed -1; -1 is what virtio and other "
                                           "virtual NICs report)")
    (tmp_path / "eth1").mkdir()
    (tmp_path / "eth1" / "speed").write_text("100000\n")
    c = check_ports("auto", tmp_path)
    assert (c.status, c.found) == ("ok", "sysfs: eth1 100 Gbit/s")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a second user to be another one than the daemon's (root)")
def test_a_user_who_cannot_reach_the_segment_fails_with_its_fix(tmp_path):
    done = doctor("--json", "--user", "nobody")  # the command, for real
    user = checks(done)["user"]
    assert done.returncode == 1 and user["status"] == "fail"
    assert "--group G" in user["todo"] and "usermod -aG G nobody" in user["todo"]
    # The same check in process for the variants (each laxflow start costs seconds on a shared machine).
    hooks = str(tmp_path / "h.sock")
    assert check_user("nobody", "nogroup", "/laxflow-doctor-none", hooks).status == "ok"
    missing = check_user("nobody", "no-such-group-lxf", "/laxflow-doctor-none", hooks)
    assert missing.status == "fail" and "groupadd" in missing.todo
    # A live daemon's segment as it is: 0600 root, then 0660 shared with nobody's group.
    name = f"/lxf-doctor-{os.getpid()}"
    seg = Path("/dev/shm") / name[1:]
    seg.write_bytes(b"\0" * 64)
    try:
        os.chmod(seg, 0o600)
        c = check_user("nobody", None, name, hooks)
        assert c.status == "fail" and str(seg) in c.found and "mode 0600" in c.found and "--group G" in c.todo
        os.chown(seg, -1, 65534)
        os.chmod(seg, 0o660)
        assert check_user("nobody", None, name, hooks).status == "ok"
        os.chown(seg, -1, 0)  # 0660 but root's group: the fix is to join it
        c = check_user("nobody", None, name, hooks)
        assert c.status == "fail" and "usermod -aG root nobody" in c.todo
    finally:
        seg.unlink()


def test_an_unknown_user_fails(tmp_path):
    c = check_user("no-such-user-lxf", None, "/laxflow", str(tmp_path / "h.sock"))
    assert c.status == "fail" and "no such user" in c.found


def test_env_names_what_a_job_would_inherit():
    env = checks(doctor("--json", env={"NCCL_IB_TC": "5", "MC_IB_TC": "104", "LD_PRELOAD": "/x/libother.so"}))["env"]
    assert env["status"] == "warn"
    assert "NCCL_IB_TC=5" in env["found"] and "MC_IB_TC=104" in env["found"] and "/x/libother.so" in env["found"]
    assert "unset it" in env["todo"]


@pytest.mark.parametrize("args, says", [
    (["--bogus"], "No such option: --bogus"),
    (["--shm", "bad"], "--shm: expected '/name'"),
    (["--hooks", "tcp://1.2.3.4:5"], "--hooks: expected ipc://PATH"),
    (["--user"], "--user"),
])
def test_bad_flags_give_one_error_line(args, says):
    done = doctor(*args)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laxflow: error:") and says in lines[0]
