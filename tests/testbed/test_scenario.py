"""``testbed run --scenario contention`` end to end: short, bounded, tears down.

Asserts behaviour, never timing: every mode (off, static, on) completes every
request; in "on" the daemons permitted the ranks' messages and the permits'
DSCPs are on the wire (seen at the switch's egress ports); "off" is one
class; the ratios are reported, not asserted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from laxflow.cli import app
from laxflow.errors import UserError
from laxflow.testbed.fabric import existing_namespaces
from laxflow.testbed.scenario import ScenarioConfig, stage_dscp

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="testbed needs root (network namespaces and qdiscs)")


@root_only
def test_contention_end_to_end() -> None:
    """off, static and on (coordinator + a daemon per host) all complete; in
    "on" the daemons really permitted the prefill ranks' messages and every
    DSCP those permits carried was seen on the switch's egress ports."""
    name = f"s{os.getpid() % 100000}e"
    # (the workers' own TCP for stages 1 and 3; the Mooncake path, the default when installed, has its own test)
    result = CliRunner().invoke(app, ["testbed", "run", "--scenario", "contention", "--name", name,
                                      "--requests", "3", "--transport", "tcp", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for mode in ("off", "static", "on"):
        assert out[mode]["cct_mean"] > 0 and out[mode]["ttft_mean"] > 0
        assert 0 <= out[mode]["slo_attainment"] <= 1
    assert out["cct_ratio"] == pytest.approx(out["off"]["cct_mean"] / out["on"]["cct_mean"])
    assert out["transport"] == "tcp" and out["collective"] in ("gloo", "tcp")
    # the SLO is the paper's: 3 x the TTFT measured at low load, the same for every mode
    assert out["slo_s"] == pytest.approx(3 * out["low_load_ttft_s"]) and out["low_load_ttft_s"] > 0
    used = out["on"]["permit_dscp_prefill"]  # "s<stage>:<dscp>" -> messages
    stages = {k.split(":")[0] for k in used}
    # a message may fail open (stale heartbeat on a loaded machine): most, not all, carry a permit
    assert stages <= {"s1", "s2", "s3"} and {"s1", "s2"} <= stages, used
    assert 0 < sum(used.values()) <= 2 * (3 + 2) * 4 * 3  # ranks x (requests + warmup) x layers x stages
    # reads are permitted at the prefill host, which knows its layer: several layers ahead, several classes
    assert len({k for k in used if k.startswith("s1:")}) >= 2, used
    seen = {int(k) for k, v in out["dscp_seen"].items() if v > 0}
    assert {int(k.split(":")[1]) for k in used} <= seen, (used, out["dscp_seen"])
    assert set(out["off"]["dscp_seen"]) <= {"0"}  # off is one class on the wire too
    # the hosts' TCP congestion control, which the namespaces take from this machine's default
    assert out["tcp_congestion_control"] == Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    assert not any(ns.startswith(f"{name}-") for ns in existing_namespaces())


def test_off_is_one_class_and_on_follows_the_dscp_map() -> None:
    assert set(stage_dscp("off").values()) == {0}
    on = stage_dscp("on")
    assert on[2] > on[1] > on[3]  # collective above reuse above p2d: higher DSCP = higher level here
    assert len(set(on.values())) == 3


def test_bad_scenario_config() -> None:
    with pytest.raises(UserError, match="tagger"):
        ScenarioConfig(tagger="magic")
    with pytest.raises(UserError, match="requests"):
        ScenarioConfig(requests=0)
    with pytest.raises(UserError, match="modes"):
        ScenarioConfig(modes=("off", "static"))
    with pytest.raises(UserError, match="tagger shim"):
        ScenarioConfig(tagger="sockopt")
    with pytest.raises(UserError, match="warmup"):
        ScenarioConfig(warmup=-1)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(UserError, match="spare_share"):
            ScenarioConfig(spare_share=bad)

    result = CliRunner().invoke(app, ["testbed", "run", "--scenario", "training"])
    assert isinstance(result.exception, UserError) and "--scenario" in str(result.exception)
    result = CliRunner().invoke(app, ["testbed", "run", "--transport", "rdma"])
    assert isinstance(result.exception, UserError) and "--transport: expected auto, mooncake or tcp" in str(result.exception)
