"""CURVE: key files, and a coordinator that admits only the keys it was given."""

from __future__ import annotations

import stat
import subprocess
import time

import pytest
from cptest import LAXFLOW, CoordinatorProcess, TestDaemon, request

from laxflow.coordinator.client import Endpoints, request_status
from laxflow.coordinator.core import CoordinatorConfig
from laxflow.coordinator.keys import ClientKeys, ServerKeys, generate
from laxflow.coordinator.server import ServerConfig
from laxflow.errors import UserError
from laxflow.protocol import messages as m


def test_keys_generate_cli(tmp_path):
    d = tmp_path / "keys"
    out = subprocess.run([LAXFLOW, "keys", "generate", str(d), "--client", "node1", "--client", "node2"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    files = sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())
    assert files == ["clients/node1.key", "clients/node1.key_secret", "clients/node2.key", "clients/node2.key_secret",
                     "coordinator.key", "coordinator.key_secret"]
    assert all(stat.S_IMODE((d / f).stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700 and stat.S_IMODE((d / "clients").stat().st_mode) == 0o700
    server, client = ServerKeys.load(d), ClientKeys.load(d, "node2")
    assert client.server_public == server.public and len(client.secret) == 40
    # adding a client later keeps the coordinator's pair; an existing name is refused
    generate(d, ["node3"])
    assert ServerKeys.load(d).public == server.public
    again = subprocess.run([LAXFLOW, "keys", "generate", str(d), "--client", "node1"], capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_bad_key_files_are_one_line_errors(tmp_path):
    d = tmp_path / "k"
    generate(d)
    with pytest.raises(UserError, match="not found"):
        ClientKeys.load(d, "nobody")
    (d / "clients" / "client.key_secret").chmod(0o644)
    with pytest.raises(UserError, match="readable by others"):
        ClientKeys.load(d)
    (d / "clients" / "client.key_secret").chmod(0o600)
    (d / "coordinator.key").write_text("garbage\n")
    with pytest.raises(UserError, match="coordinator.key"):
        ClientKeys.load(d)


def test_curve_required_off_loopback():
    with pytest.raises(UserError, match="refusing"):
        ServerConfig(bind="tcp://0.0.0.0:5555").check()
    with pytest.raises(UserError, match="refusing"):
        ServerConfig(bind="tcp://*:5555").check()
    assert not ServerConfig(bind="tcp://0.0.0.0:5555", insecure=True).check().loopback
    assert ServerConfig(bind="tcp://127.0.0.1:5555").check().loopback
    assert ServerConfig(bind="tcp://localhost:5555").check().loopback
    assert ServerConfig(bind="ipc:///tmp/x").check().pub == "ipc:///tmp/x.pub"
    assert Endpoints.parse("tcp://[::1]:7").loopback
    assert ServerConfig(bind="tcp://10.0.0.1:5555", curve_keys="/k", core=CoordinatorConfig()).check()


def test_only_the_right_key_gets_in(tmp_path):
    keys, other = tmp_path / "keys", tmp_path / "other"
    generate(keys)
    generate(other)
    c = CoordinatorProcess(tmp_path, keys=keys).start()  # start() waits for a status answer with the right key
    daemon = TestDaemon(c.address, "n1", ["n1/p0"], keys=ClientKeys.load(keys))
    # knows the coordinator's public key (it is public) but holds a client key the coordinator never admitted
    stranger = ClientKeys.load(other)
    stranger = ClientKeys(stranger.public, stranger.secret, ClientKeys.load(keys).server_public)
    intruder = TestDaemon(c.address, "evil", ["evil/p0"], keys=stranger)
    plain = TestDaemon(c.address, "plain", ["plain/p0"])
    try:
        daemon.arrive(m.BatchInfo("b", 0.0, (request("r", time.time() + 5, 1.0, "n1/p0", "n1/p0"),)))
        intruder.arrive(m.BatchInfo("x", 0.0, (request("xr", time.time() + 1, 1.0, "evil/p0", "evil/p0"),)))
        daemon.wait_for(lambda d: [r.batch_id for r in d.order] == ["b"])
        time.sleep(1.0)
        s = request_status(c.address, keys=ClientKeys.load(keys))
        assert [d.node for d in s.daemons] == ["n1"]  # neither the wrong key nor no key reached the core
        assert intruder.decisions == [] and plain.decisions == []  # nor did they hear the PUB
        for bad in (stranger, ClientKeys.load(other), None):
            with pytest.raises(UserError, match="no coordinator answered"):
                request_status(c.address, keys=bad, timeout_s=0.5)
        metrics = c.metrics()  # refusals are counted: unknown client key -> ZAP denies (auth); no CURVE -> protocol
        assert metrics["laxflow_coordinator_handshake_failures_total{kind=auth}"] >= 1
        assert metrics["laxflow_coordinator_handshake_failures_total{kind=protocol}"] >= 1
        ok = subprocess.run([LAXFLOW, "status", "--coordinator", c.address, "--curve-keys", str(keys), "--json"],
                            capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and '"node": "n1"' in ok.stdout, ok.stderr
    finally:
        for d in (daemon, intruder, plain):
            d.close()
        c.stop()


def test_require_keys_refuses_to_start_without_curve_even_on_loopback(tmp_path):
    from cptest import free_port

    address = f"tcp://127.0.0.1:{free_port(pair=True)}"
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", address, "--require-keys"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--require-keys" in out.stderr and "--curve-keys" in out.stderr
    out = subprocess.run([LAXFLOW, "coordinator", "--bind", address, "--require-keys", "--insecure"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    with pytest.raises(UserError, match="--require-keys"):
        ServerConfig(bind="ipc:///tmp/x", require_keys=True).check()


def test_status_says_curve(tmp_path):
    keys = tmp_path / "keys"
    generate(keys)
    c = CoordinatorProcess(tmp_path, keys=keys)
    c.args.append("--require-keys")
    c.start()
    try:
        table = subprocess.run([LAXFLOW, "status", "--coordinator", c.address, "--curve-keys", str(keys)],
                               capture_output=True, text=True, timeout=30)
        assert table.returncode == 0 and "auth: CURVE" in table.stdout, table.stdout + table.stderr
    finally:
        c.stop()


def test_daemon_with_a_refused_key_says_so_counts_it_and_comes_back_when_admitted(tmp_path):
    """A daemon whose CURVE key the coordinator does not admit ran silently in local mode: now one warning line
    naming the coordinator, a counter, its status says why, `laxflow status` shows the refusals; and once the
    key is admitted (coordinator restarted) it reconnects by itself (ZeroMQ gives up after a refusal)."""
    import shutil
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
    from daemontest import DaemonProc, wait_for

    from laxflow.hooks import HooksClient

    keys, mine = tmp_path / "keys", tmp_path / "n1-keys"
    generate(keys)
    generate(mine, ["n1"])  # a key pair the coordinator was never given
    (mine / "coordinator.key").unlink()
    shutil.copy(keys / "coordinator.key", mine / "coordinator.key")
    admin = ClientKeys.load(keys)
    c = CoordinatorProcess(tmp_path, keys=keys).start()
    d = DaemonProc(tmp_path, coordinator=c.address, config={"keys_dir": str(mine)})
    try:
        refused = lambda: [x for x in d.log if "refused our CURVE key" in x]  # noqa: E731
        wait_for(refused, 15, "the daemon's warning")
        time.sleep(2.5)  # retries meanwhile: still one line
        assert len(refused()) == 1 and c.address in refused()[0], "".join(d.log)
        text = d.metrics()
        line = [x for x in text.splitlines() if x.startswith("laxflow_daemon_coordinator_auth_failures_total{")
                and 'kind="auth"' in x]
        assert line and float(line[0].split()[-1]) >= 1, text
        with HooksClient(d.hooks) as hooks:
            st = hooks.status()
        assert st.mode == "local" and "refused our CURVE key" in st.coordinator_error, st
        table = subprocess.run([LAXFLOW, "status", "--coordinator", c.address, "--curve-keys", str(keys)],
                               capture_output=True, text=True, timeout=30)
        assert "auth: CURVE" in table.stdout and "refused at the handshake: auth" in table.stdout, table.stdout
        mine_view = subprocess.run([LAXFLOW, "status", "--coordinator", c.address, "--hooks", d.hooks, "--timeout", "1"],
                                   capture_output=True, text=True, timeout=30)  # from the node, with its own key refused
        assert "daemon n1: local: coordinator refused our CURVE key" in mine_view.stdout, mine_view.stdout
        assert mine_view.returncode == 2 and "no coordinator answered" in mine_view.stderr
        assert [x.node for x in request_status(c.address, keys=admin).daemons] == []

        shutil.copy(mine / "clients" / "n1.key", keys / "clients" / "n1.key")  # the operator admits it
        c.stop()
        c.start()
        wait_for(lambda: [x.node for x in request_status(c.address, keys=admin).daemons] == ["n1"], 30,
                 "the daemon to reconnect")
        with HooksClient(d.hooks) as hooks:
            wait_for(lambda: (s := hooks.status()) is not None and s.mode == "coordinated" and not s.coordinator_error,
                     10, "coordinated mode")
    finally:
        d.cleanup()
        c.stop()
