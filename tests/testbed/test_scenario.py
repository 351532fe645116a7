"""``testbed run --scenario contention`` end to end: short, bounded, tears down.

Asserts behaviour, never timing: both modes complete every request, the "on"
mode's stage DSCPs are on the wire (seen at the switch's egress ports) and
the "off" mode is one class; the ratios are reported, not asserted.
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from laxflow.cli import app
from laxflow.errors import UserError
from laxflow.testbed.fabric import existing_namespaces
from laxflow.testbed.scenario import ScenarioConfig, stage_dscp

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="testbed needs root (network namespaces and qdiscs)")


@root_only
@pytest.mark.parametrize("tagger", ["shim"])  # sockopt differs only in who sets IP_TOS
def test_contention_end_to_end(tagger: str) -> None:
    name = f"s{os.getpid() % 100000}{tagger[:2]}"
    result = CliRunner().invoke(app, ["testbed", "run", "--scenario", "contention", "--name", name,
                                      "--requests", "3", "--tagger", tagger, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for mode in ("off", "on"):
        assert out[mode]["cct_mean"] > 0 and out[mode]["ttft_mean"] > 0
        assert 0 <= out[mode]["slo_attainment"] <= 1
    assert out["cct_ratio"] == pytest.approx(out["off"]["cct_mean"] / out["on"]["cct_mean"])
    seen = {int(k) for k, v in out["dscp_seen"].items() if v > 0}
    assert set(stage_dscp("on").values()) <= seen, out["dscp_seen"]
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
    result = CliRunner().invoke(app, ["testbed", "run", "--scenario", "training"])
    assert isinstance(result.exception, UserError) and "--scenario" in str(result.exception)
