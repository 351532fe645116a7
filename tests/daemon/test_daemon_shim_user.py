"""A serving job run by another user than the daemon's (a vLLM job as ``vllm``, the daemon as root under systemd).

Without the daemon's ``group`` the segment is mode 0600: the job's shim cannot attach (EACCES), says so once on
stderr, counts it (``laxflow_shim_attach_denied``) and lets the job's traffic through unscheduled (fail open).
With ``group`` set (config key or ``--group``) and the job's user in that group, the segment, the doorbell and the
hooks sockets are 0660 and the group's: the job attaches and the daemon gates it.  The job is the C verbs client
of tests/native on the fake provider, run under a system user created for the test.
"""

from __future__ import annotations

import grp
import itertools
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from daemontest import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "native"))
from shimtest import Client, NativeBin, client_env, log_by_qp, run_client  # noqa: E402

from laxflow.daemon.config import load_config  # noqa: E402
from laxflow.errors import UserError  # noqa: E402
from laxflow.protocol.shm import EventKind, Segment, Stage  # noqa: E402
from laxflow.shim import shim_path  # noqa: E402

REQUEST = 77
_ids = itertools.count()

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("groupadd"),
                                reason="needs root and useradd/groupadd to run a job as a second user")


@pytest.fixture
def job_user():
    """A system user (the serving job's) and a system group it is not in yet (the daemon's); removed after."""
    tag = f"{os.getpid() % 100000}{next(_ids)}"
    user, group = f"lxfjob{tag}", f"lxfgrp{tag}"
    subprocess.run(["groupadd", "--system", group], check=True, capture_output=True)
    try:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True,
                       capture_output=True)
        try:
            yield pwd.getpwnam(user), grp.getgrnam(group)
        finally:
            subprocess.run(["userdel", user], capture_output=True)
    finally:
        subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture
def job_bin(native_bin):
    """The verbs client, the fake provider and the shim where any user can load them (pytest's tmp, and a checkout
    under a private directory such as mktemp's, are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="lxf-job-"))
    try:
        os.chmod(d, 0o755)
        shutil.copytree(native_bin.fakelib_dir, d / "fakelib")
        shutil.copy2(native_bin.verbs_client, d / "verbs_client")
        shutil.copy2(shim_path(), d / "liblaxflow_shim.so")
        logs = d / "logs"
        logs.mkdir()
        os.chmod(logs, 0o777)
        yield NativeBin(d / "fakelib", d / "verbs_client"), logs
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _blocked_port(d):
    """A collective of another rank already granted on the port: a reuse fetch submitted now is held."""
    seg = Segment.attach(d.shm)
    blocker = seg.alloc_msg_id()
    seg.push_event(EventKind.LAYER_BOUNDARY, request_id=REQUEST, layer=0)
    seg.push_event(EventKind.SUBMIT, blocker, REQUEST, 1 << 20, Stage.COLLECTIVE, 0, 999)
    wait_for(lambda: seg.get_permit(blocker), what="blocker granted")
    return seg, blocker


def _start_job(job_bin, d, user, groups):
    (native, logs), args = job_bin, ["direct", "2", "30", "1"]
    ref_log = logs / "reference.log"
    assert run_client(native, args, client_env(native, ref_log)).returncode == 0
    log = logs / "shim.log"
    client = Client(native, [*args, "--wait", "--shim-stats"], client_env(native, log, native.verbs_client.parent / "liblaxflow_shim.so", d.shm), user=user.pw_uid,
                    group=user.pw_gid, extra_groups=groups)
    pid, qps = client.qps()
    return client, log, pid, qps, client.plan(len(qps), 1), log_by_qp(ref_log)


def _tag(seg, pid, qps, plan):
    coll = seg.tag_qp(pid, qps[0], REQUEST, Stage.COLLECTIVE, 0, bytes=plan[qps[0], 0])
    reuse = seg.tag_qp(pid, qps[1], REQUEST, Stage.REUSE, 3, bytes=plan[qps[1], 0])
    return coll, reuse


def _mode_and_gid(path) -> tuple[int, int]:
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_gid


def test_job_of_another_user_is_warned_counted_and_passes_through(start_daemon, job_user, job_bin):
    user, _ = job_user
    d = start_daemon(config={"window_bytes": 0, "stale_ms": 2000})
    assert _mode_and_gid(f"/dev/shm{d.shm}")[0] == 0o600
    seg, _ = _blocked_port(d)
    try:
        client, log, pid, qps, plan, ref = _start_job(job_bin, d, user, [])
        _, reuse = _tag(seg, pid, qps, plan)  # would be held behind the blocker, were the job attached
        client.send()
        client.expect("POSTED 0")
        denied = int(client.expect("SHIM attach_denied=").split("=")[1])
        assert client.wait() == 0
        stderr = client.proc.stderr.read()
        assert stderr.count("laxflow shim: cannot attach") == 1, stderr  # once, however often it retried
        assert d.shm in stderr and "permission denied" in stderr and "--group" in stderr, stderr
        assert denied >= 1
        assert log_by_qp(log) == ref  # every WR reached the device: fail open
        assert seg.get_permit(reuse) is None and seg.counters()["wr_deferred"] == 0
        assert pid not in [p for p, _ in seg.procs()]
    finally:
        seg.close(unlink=False)


@pytest.mark.parametrize("by", ["name", "gid"])
def test_job_of_a_user_in_the_daemons_group_is_gated(start_daemon, job_user, job_bin, by):
    user, group = job_user
    d = start_daemon(config={"window_bytes": 0, "stale_ms": 2000,
                             "group": group.gr_name if by == "name" else group.gr_gid})
    seg, blocker = _blocked_port(d)
    try:
        hooks = d.hooks[len("ipc://"):]
        for path in (f"/dev/shm{d.shm}", seg.bell_path, hooks, hooks + ".pub"):
            assert _mode_and_gid(path) == (0o660, group.gr_gid), path
        client, log, pid, qps, plan, ref = _start_job(job_bin, d, user, [group.gr_gid])
        coll, reuse = _tag(seg, pid, qps, plan)
        client.send()
        client.expect("POSTED 0")
        n_coll = len(ref[f"qp={qps[0]}"])
        wait_for(lambda: log.read_text().count(f"POST qp={qps[0]} ") == n_coll, what="collective posted")
        time.sleep(0.05)
        # The reuse fetch is held by the daemon: the job is attached and scheduled.
        assert seg.get_permit(reuse) is None and f"POST qp={qps[1]} " not in log.read_text()
        assert seg.counters()["wr_deferred"] > 0 and pid in [p for p, _ in seg.procs()]
        seg.push_event(EventKind.COMPLETION, blocker, REQUEST, 1 << 20, Stage.COLLECTIVE, 0, 999)
        denied = int(client.expect("SHIM attach_denied=").split("=")[1])
        assert client.wait() == 0
        assert denied == 0 and "laxflow shim" not in client.proc.stderr.read()
        assert log_by_qp(log) == ref
        assert seg.counters()["wr_failopen"] == 0
    finally:
        seg.close(unlink=False)


def test_unknown_group_is_one_clear_error(tmp_path):
    ports = tmp_path / "ports.json"
    ports.write_text('{"ports": [{"name": "eth0", "gbps": 100}]}')
    with pytest.raises(UserError, match=r"^group: no such Unix group 'lxf-no-such-group' "):
        load_config({"node": "n1", "ports": str(ports), "group": "lxf-no-such-group"}, env={})
    with pytest.raises(UserError, match=r"^group: expected a gid 0\.\.4294967294, got 4294967295$"):
        load_config({"node": "n1", "ports": str(ports), "group": "4294967295"}, env={})
    assert load_config({"node": "n1", "ports": str(ports)}, env={}).group_id is None
    assert load_config({"node": "n1", "ports": str(ports), "group": "root"}, env={}).group_id == 0
    assert load_config({"node": "n1", "ports": str(ports), "group": "4242"}, env={}).group_id == 4242  # k8s gid
