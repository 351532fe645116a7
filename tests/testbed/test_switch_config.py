"""switch-config: golden files per vendor, and each line checked against the vendor's documented grammar.

Regenerate a golden file only after checking the change against the vendor's
documentation (sources in laxflow/testbed/switch_config.py):
``laxflow testbed switch-config --vendor sonic --ports Ethernet0,Ethernet4 > tests/testbed/golden/sonic.json``
``laxflow testbed switch-config --vendor onyx --ports 1/1,1/2 --nic mlnx > tests/testbed/golden/onyx.txt``
``laxflow testbed switch-config --vendor cumulus --nic mlnx > tests/testbed/golden/cumulus.txt``
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from laxflow.cli import app
from laxflow.errors import UserError
from laxflow.policy.dscp import default_dscp_map
from laxflow.testbed.switch_config import render

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "sonic.json": ["--vendor", "sonic", "--ports", "Ethernet0,Ethernet4"],
    "onyx.txt": ["--vendor", "onyx", "--ports", "1/1,1/2", "--nic", "mlnx"],
    "cumulus.txt": ["--vendor", "cumulus", "--nic", "mlnx"],
}

# Documented command shapes (see the module docstring for the sources).
ONYX = [r"interface ethernet \d+/\d+ qos trust L3", r"interface ethernet \d+/\d+ traffic-class [0-7] dcb ets strict",
        r"interface ethernet \d+/\d+ traffic-class [0-7] bind switch-priority [0-7]"]
NVUE = [r"nv set qos mapping default-global trust l3", r"nv set qos mapping default-global dscp \d+ switch-priority [0-7]",
        r"nv set qos egress-queue-mapping default-global switch-priority [0-7] traffic-class [0-7]",
        r"nv set qos egress-scheduler default-global traffic-class [0-7] mode strict", r"nv config apply"]
MLNX = [r"mlnx_qos -i \S+ --trust dscp", r"mlnx_qos -i \S+ --dscp2prio set,\d+,[0-7]",
        r"mlnx_qos -i \S+ --prio_tc [0-7](,[0-7]){7}", r"mlnx_qos -i \S+ --tsa strict(,strict){7}",
        r"cma_roce_tos -d \S+ -t \d+"]


@pytest.mark.parametrize("golden", sorted(CASES))
def test_output_matches_golden_file(golden: str) -> None:
    result = CliRunner().invoke(app, ["testbed", "switch-config", *CASES[golden]])
    assert result.exit_code == 0, result.output
    assert result.output == (GOLDEN / golden).read_text()


def _commands(text: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("golden,grammar", [("onyx.txt", ONYX + MLNX), ("cumulus.txt", NVUE + MLNX)])
def test_every_command_has_a_documented_shape(golden: str, grammar: list[str]) -> None:
    for line in _commands((GOLDEN / golden).read_text()):
        assert any(re.fullmatch(g, line) for g in grammar), line


def test_maps_follow_laxflows_dscp_map() -> None:
    dscp_map = default_dscp_map(8)
    db = json.loads((GOLDEN / "sonic.json").read_text())
    dscp_tc = db["DSCP_TO_TC_MAP"]["LAXFLOW"]
    assert len(dscp_tc) == 64
    for level in range(dscp_map.levels):
        assert dscp_tc[str(dscp_map.dscp(level))] == str(dscp_map.level_tc[level])
    assert dscp_tc["8"] == "0" and dscp_tc["48"] == "6" and dscp_tc["26"] == "3"
    assert db["SCHEDULER"] == {"LAXFLOW_STRICT": {"type": "STRICT"}}
    assert set(db["QUEUE"]) == {f"{p}|{q}" for p in ("Ethernet0", "Ethernet4") for q in range(8)}
    assert db["PORT_QOS_MAP"]["Ethernet4"] == {"dscp_to_tc_map": "LAXFLOW", "tc_to_queue_map": "LAXFLOW"}
    nvue = (GOLDEN / "cumulus.txt").read_text()
    for level in range(dscp_map.levels):
        assert f"dscp {dscp_map.dscp(level)} switch-priority {dscp_map.level_tc[level]}" in nvue
        assert f"--dscp2prio set,{dscp_map.dscp(level)},{dscp_map.level_tc[level]}" in nvue


def test_levels_option_changes_the_map() -> None:
    text = render("cumulus", levels=4)
    assert "dscp 35 switch-priority 5" in text and "dscp 32 switch-priority" in text and "dscp 39" not in text


@pytest.mark.parametrize("kwargs,needle", [
    ({"vendor": "arista"}, "--vendor"), ({"vendor": "sonic", "nic": "bcm"}, "--nic"),
    ({"vendor": "sonic", "ports": "swp1"}, "--ports"), ({"vendor": "onyx", "levels": 40}, "--levels"),
])
def test_bad_options_are_one_line_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        render(**kwargs)
