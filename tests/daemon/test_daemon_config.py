"""Daemon configuration: flags, config file, ports file, sysfs discovery; bad input is one clear line."""

from __future__ import annotations

import json
import subprocess

import pytest
from daemontest import LAXFLOW

from laxflow.daemon.config import load_config
from laxflow.daemon.ports import LinkMeter, discover_ports, load_ports_file
from laxflow.errors import UserError


def test_flags_win_over_the_file_and_env_is_read_only_here(tmp_path):
    cfg = tmp_path / "d.json"
    cfg.write_text(json.dumps({"node": "from-file", "ports": [{"name": "eth0", "gbps": 200}], "stale_ms": 50,
                               "mfs": {"period": 0.002}, "window_bytes": 1000}))
    c = load_config({"config": str(cfg), "node": "n7", "metrics_port": None}, env={"LAXFLOW_SHM_NAME": "/seg7",
                                                                                "XDG_RUNTIME_DIR": str(tmp_path)})
    assert (c.node, c.shm, c.stale_ms) == ("n7", "/seg7", 50)
    assert c.core.ports[0].rate == 200e9 / 8 and c.core.mfs.period == 0.002 and c.core.window_bytes == 1000
    assert c.hooks == f"ipc://{tmp_path}/laxflow-hooks-seg7.sock"
    assert c.port_ids == ["n7/eth0"]


@pytest.mark.parametrize("raw, message", [
    ({"ports": []}, "expected {\"ports\": [...]}"),
    ({"ports": [{"name": "a"}]}, "give exactly one of 'gbps' and 'rate'"),
    ({"ports": [{"name": "a", "gbps": -1}]}, "gbps must be a number > 0"),
    ({"ports": [{"name": "a", "gbps": 1}, {"name": "a", "gbps": 1}]}, "duplicate port name 'a'"),
    ({"ports": [{"name": "a", "gbps": 1, "speed": 3}]}, "unknown field 'speed'"),
    ({"ports": [{"name": "a", "gbps": 1, "window": -5}]}, "'window' must be a number of bytes >= 0"),
    ({"ports": [{"name": "a", "gbps": 1, "window": "big"}]}, "'window' must be a number of bytes >= 0"),
])
def test_bad_ports_file_names_the_field(tmp_path, raw, message):
    f = tmp_path / "ports.json"
    f.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]").replace("{", r"\{")):
        load_ports_file(f)


def test_sysfs_discovery_reads_speed_and_counter(tmp_path):
    for name, speed in (("lo", "10"), ("eth0", "100000"), ("veth1", "-1"), ("ib0", "200000")):
        (tmp_path / name / "statistics").mkdir(parents=True)
        (tmp_path / name / "speed").write_text(speed + "\n")
        (tmp_path / name / "statistics" / "tx_bytes").write_text("0\n")
    ports = discover_ports(tmp_path)
    assert [(p.name, p.rate) for p in ports] == [("eth0", 100e9 / 8), ("ib0", 200e9 / 8)]
    assert ports[0].counter.endswith("eth0/statistics/tx_bytes")
    with pytest.raises(UserError, match="pass --ports FILE"):
        discover_ports(tmp_path / "none")


def test_link_meter_is_the_engines_ewma():
    m = LinkMeter([100.0], window=1.0)
    m.sample(0, 0.0, 0.0)
    m.sample(0, 50.0, 1.0)  # u = 0.5 over 1 s
    assert m.loads()[0] == pytest.approx(0.5 * (1 - 2.718281828 ** -1), rel=1e-6)
    m.sample(0, 50.0, 1.0)  # same instant: ignored
    m.sample(0, 1e9, 2.0)  # more than capacity: clipped to 1
    assert 0 < m.loads()[0] <= 1


def test_link_meter_carries_a_counters_burst_into_the_next_intervals():
    # a saturated 100-byte/s link whose counter jumps by 2 s of bytes at once, then stands still for 1 s
    # (a NIC counts a TSO/GSO super-packet when it takes it): the link was busy all along
    m = LinkMeter([100.0], window=1.0)
    m.sample(0, 0.0, 0.0)
    total, loads = 0.0, []
    for t in range(1, 21):
        total += 200.0 if t % 2 == 1 else 0.0
        m.sample(0, total, float(t))
        loads.append(float(m.load[0]))
    assert loads == sorted(loads) and loads[-1] == pytest.approx(1.0, abs=1e-6)  # never idle between the jumps
    # the carry is bounded (one window's bytes): a counter that jumps far ahead is not owed for ever
    m = LinkMeter([100.0], window=1.0)
    m.sample(0, 0.0, 0.0)
    m.sample(0, 1e9, 1.0)
    m.sample(0, 1e9, 2.0)
    m.sample(0, 1e9, 3.0)
    assert m.load[0] < 1.0


@pytest.mark.parametrize("args, message", [
    (["--node", "bad name"], "--node: expected"),
    (["--node", "n1", "--ports", "/nonexistent.json"], "/nonexistent.json: ports file: cannot read"),
    (["--node", "n1", "--shm", "noslash"], "--shm: expected '/name'"),
    (["--node", "n1", "--coordinator", "http://x"], "--coordinator: expected tcp://HOST:PORT"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, message):
    ports = tmp_path / "p.json"
    ports.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 1}]}))
    if "--ports" not in args:
        args = [*args, "--ports", str(ports)]
    out = subprocess.run([*LAXFLOW, "daemon", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def test_unknown_config_key_is_refused(tmp_path):
    cfg = tmp_path / "d.json"
    cfg.write_text(json.dumps({"node": "n", "portz": "auto"}))
    with pytest.raises(UserError, match="unknown key 'portz'"):
        load_config({"config": str(cfg)})


def test_ports_file_window_is_per_port(tmp_path):
    f = tmp_path / "ports.json"
    f.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 1}, {"name": "eth0-rx", "gbps": 1, "window": 1e12}]}))
    tx, rx = load_ports_file(f)
    assert tx.window is None and rx.window == 1e12


def test_spin_us_is_read_from_the_file_and_validated(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"node": "n1", "ports": [{"name": "eth0", "gbps": 1}], "spin_us": 0}))
    assert load_config({"config": str(f)}).spin_us == 0
    f.write_text(json.dumps({"node": "n1", "ports": [{"name": "eth0", "gbps": 1}], "spin_us": -1}))
    with pytest.raises(UserError, match="spin_us: expected 0..1000000"):
        load_config({"config": str(f)})


@pytest.mark.parametrize("value, expected", [(None, None), (0.5, 0.5), ("absent", 0.25)])
def test_spare_share_is_read_from_the_file(tmp_path, value, expected):
    f = tmp_path / "d.json"
    raw = {"node": "n1", "ports": [{"name": "eth0", "gbps": 1}]}
    if value != "absent":
        raw["spare_share"] = value
    f.write_text(json.dumps(raw))
    assert load_config({"config": str(f)}).core.spare_share == expected


@pytest.mark.parametrize("value, message", [("half", "spare_share: expected a number"),
                                            (2, r"spare_share must be a share of the line rate in \(0, 1\]")])
def test_bad_spare_share_is_one_clear_error(tmp_path, value, message):
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"node": "n1", "ports": [{"name": "eth0", "gbps": 1}], "spare_share": value}))
    with pytest.raises(UserError, match=message):
        load_config({"config": str(f)})


def test_message_ttl_s_is_read_from_the_file_and_validated(tmp_path):
    f = tmp_path / "d.json"
    raw = {"node": "n1", "ports": [{"name": "eth0", "gbps": 1}]}
    f.write_text(json.dumps(raw))
    assert load_config({"config": str(f)}).core.message_ttl == 60.0
    f.write_text(json.dumps(dict(raw, message_ttl_s=5)))
    assert load_config({"config": str(f)}).core.message_ttl == 5.0
    f.write_text(json.dumps(dict(raw, message_ttl_s=0)))
    with pytest.raises(UserError, match="message_ttl must be > 0 s"):
        load_config({"config": str(f)})
