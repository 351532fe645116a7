"""The emulated fabric with real namespaces, real TCP streams and real packets.

Root only (skipped otherwise, with the reason). Every testbed gets a prefix
unique to this process so helpers running tests at the same time never
collide; each test removes what it created and checks nothing is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from laxflow.cli import app
from laxflow.errors import UserError
from laxflow.policy.dscp import default_dscp_map
from laxflow.testbed.fabric import STATE_DIR, FabricConfig, Testbed, existing_namespaces, tc_of_dscp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="testbed needs root (network namespaces and qdiscs)")
_counter = iter(range(1000))


def unique_name() -> str:
    return f"t{os.getpid() % 100000}x{next(_counter)}"


def leftovers(name: str) -> list[str]:
    return sorted(ns for ns in existing_namespaces() if ns.startswith(f"{name}-"))


@pytest.fixture
def testbed():
    tb = Testbed(FabricConfig(hosts=3, rate="100mbit", name=unique_name()))
    tb.up()
    try:
        yield tb
    finally:
        tb.down()
        assert leftovers(tb.config.name) == []


def start_capture(tb: Testbed, ifaces: str, seconds: float, *extra: str) -> subprocess.Popen:
    """verify-dscp in the switch namespace; returns once its sockets are open."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", tb.netns("sw"), sys.executable, "-c", "from laxflow.cli import main; main()",
         "testbed", "verify-dscp", "--iface", ifaces, "--seconds", str(seconds), "--json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stderr.readline().startswith("capturing on")
    return proc


# Senders start sending this long after they are launched (together, at one instant): each is a
# Python process, which a loaded machine can take most of a second to start.
LEAD_S = 2.0


def streams(tb: Testbed, dscp_a: int, dscp_b: int, seconds: float = 2.0, stagger: float = 0.0) -> dict[str, int]:
    """h0 -> h2 with dscp_a and h1 -> h2 with dscp_b over the same window: both cross switch port p2.
    ``stagger``: launch the second sender that much after the first (a slow process start)."""
    py = sys.executable
    dst = tb.address(2)
    sink = tb.popen_in(2, [py, "-m", "laxflow.testbed.traffic", "sink", "--ports", "5001,5002",
                           "--seconds", str(LEAD_S + seconds + 1)], stdout=subprocess.PIPE)
    time.sleep(0.3)
    at = time.time() + LEAD_S
    senders = []
    for h, port, dscp in ((0, 5001, dscp_a), (1, 5002, dscp_b)):
        if senders:
            time.sleep(stagger)
        senders.append(tb.popen_in(h, [py, "-m", "laxflow.testbed.traffic", "send", "--dst", dst, "--port", str(port),
                                       "--dscp", str(dscp), "--seconds", str(seconds), "--at", str(at)],
                                   stdout=subprocess.PIPE))
    for s in senders:
        s.communicate(timeout=seconds + 30)
    out, _ = sink.communicate(timeout=seconds + 30)
    return json.loads(out)


def test_higher_class_takes_the_bottleneck(testbed: Testbed) -> None:
    dscp_map = default_dscp_map(8)
    high, low = dscp_map.dscp(0), 0  # TC 5 against the default TC 0
    before = testbed.class_packets("sw", "p2")
    got = streams(testbed, high, low)
    after = testbed.class_packets("sw", "p2")
    assert got["5001"] > 0
    assert got["5001"] >= 5 * max(got["5002"], 1), got
    # and the packets went through the classes the DSCP map names
    assert after[5] - before[5] > after[0] - before[0]
    # swapping the marks swaps the winner: the queues, not the hosts, decide; also when the
    # low-class sender's process is up first (the senders send over one window)
    got = streams(testbed, low, high, stagger=0.6)
    assert got["5002"] >= 5 * max(got["5001"], 1), got


def test_same_class_shares(testbed: Testbed) -> None:
    got = streams(testbed, 0, 0)
    assert min(got.values()) > 0
    assert max(got.values()) < 5 * min(got.values()), got


def test_verify_dscp_sees_marks_on_the_wire(testbed: Testbed) -> None:
    capture = start_capture(testbed, "p2", 10)
    streams(testbed, 38, 8, seconds=1.0)
    out, _ = capture.communicate(timeout=60)
    result = json.loads(out)
    by_port = {f["dport"]: f["dscp"] for f in result["flows"] if f["proto"] == "tcp" and f["dst"] == testbed.address(2)}
    assert set(by_port[5001]) == {"38"}, by_port
    assert set(by_port[5002]) == {"8"}, by_port


def test_egress_only_counts_each_switched_packet_once(testbed: Testbed) -> None:
    ports = "p0,p1,p2"
    both, egress = start_capture(testbed, ports, 10), start_capture(testbed, ports, 10, "--egress-only")
    streams(testbed, 38, 8, seconds=1.0)
    count = {}
    for name, proc in (("both", both), ("egress", egress)):
        out, _ = proc.communicate(timeout=60)
        result = json.loads(out)
        assert result["capture_drops"] == 0
        flows = result["flows"]
        count[name] = sum(f["packets"] for f in flows if f["proto"] == "tcp" and f["dport"] == 5001)
    # every packet crosses two switch ports: in at one, out at the other
    assert count["egress"] > 0
    assert count["both"] == 2 * count["egress"], count


def test_probe_lands_in_the_mapped_class(testbed: Testbed) -> None:
    mapping = tc_of_dscp(default_dscp_map(8))
    for dscp in (39, 32, 8, 48):
        tc = mapping[dscp]
        before = testbed.class_packets("sw", "p2")
        result = CliRunner().invoke(app, ["testbed", "probe", "--netns", testbed.netns(0), "--dscp", str(dscp),
                                          "--dst", testbed.address(2), "--count", "20", "--json"])
        assert result.exit_code == 0, result.output
        after = testbed.class_packets("sw", "p2")
        assert after[tc] - before[tc] >= 20, (dscp, tc, before, after)


def test_probe_packets_are_rocev2_with_bth(testbed: Testbed) -> None:
    py = sys.executable
    capture = start_capture(testbed, "p2", 10)
    testbed.exec_in(0, [py, "-c", "from laxflow.cli import main; main()", "testbed", "probe", "--dscp", "37",
                        "--dst", testbed.address(2), "--count", "5", "--dest-qp", "77"], check=True)
    out, _ = capture.communicate(timeout=60)
    roce = [f for f in json.loads(out)["flows"] if f["proto"] == "rocev2"]
    assert len(roce) == 1 and roce[0]["dscp"] == {"37": 5}
    assert roce[0]["dest_qp"] == [77] and roce[0]["psn"] == [0, 4] and roce[0]["opcodes"] == {"0x04": 5}


def test_name_in_use_is_refused(testbed: Testbed) -> None:
    with pytest.raises(UserError, match="already exists"):
        Testbed(testbed.config).up()


def test_down_is_idempotent_and_cli_round_trip() -> None:
    name = unique_name()
    runner = CliRunner()
    result = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "50mbit", "--name", name, "--json"])
    assert result.exit_code == 0, result.output
    assert leftovers(name) == [f"{name}-h0", f"{name}-h1", f"{name}-sw"]
    assert (STATE_DIR / f"{name}.json").exists()
    status = json.loads(runner.invoke(app, ["testbed", "status"]).output)
    assert any(t["name"] == name and t["complete"] and len(t["namespaces_present"]) == 3 for t in status)
    result = runner.invoke(app, ["testbed", "down", "--name", name])
    assert result.exit_code == 0 and "removed" in result.output
    assert leftovers(name) == [] and not (STATE_DIR / f"{name}.json").exists()
    result = runner.invoke(app, ["testbed", "down", "--name", name])
    assert result.exit_code == 0 and "nothing to remove" in result.output


def test_down_after_a_crash_mid_up() -> None:
    name = unique_name()
    # A slow `up`: many hosts, killed as soon as the first namespaces exist.
    proc = subprocess.Popen([sys.executable, "-c", "from laxflow.cli import main; main()", "testbed", "up",
                             "--hosts", "40", "--rate", "10mbit", "--name", name], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not leftovers(name) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (STATE_DIR / f"{name}.json").exists()  # written before anything was created
    # leave a process behind in one namespace, as a crashed scenario would
    left = leftovers(name)
    if left:
        subprocess.Popen(["ip", "netns", "exec", left[0], "sleep", "600"])
    result = CliRunner().invoke(app, ["testbed", "down", "--name", name])
    assert result.exit_code == 0, result.output
    assert leftovers(name) == [] and not (STATE_DIR / f"{name}.json").exists()


def test_bad_flags_are_one_line_errors() -> None:
    runner = CliRunner()
    for args, needle in ((["up", "--rate", "fast"], "--rate"), (["up", "--name", "Bad-Name"], "--name"),
                         (["up", "--hosts", "1"], "--hosts"), (["verify-dscp", "--iface", "p0", "--netns", "nope-x"], "--netns")):
        result = runner.invoke(app, ["testbed", *args])
        assert result.exit_code != 0
        assert isinstance(result.exception, UserError) and needle in str(result.exception), (args, result.exception)
