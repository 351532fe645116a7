"""bench/merge_compare.py: the premerge results read by each bench's JSON shape and paired with a rerun's."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def mc(bench_script):
    return bench_script("merge_compare")


def _recorded(name: str) -> list:
    return [r["result"] for r in json.loads((BENCH / "results" / "premerge" / f"{name}.json").read_text())["runs"]]


@pytest.mark.parametrize("name", ["sim_claims", "batching_repro", "arrow_repro", "flowprefill"])
def test_every_recorded_value_pairs_with_itself(mc, name):
    rows = mc.compare(name, _recorded(name), _recorded(name))
    assert rows and not any(r["changed"] or r["beyond"] for r in rows)
    assert all(r["before"] == r["after"] and r["diff"] == 0.0 for r in rows)


def test_moved_values_are_marked_changed(mc):
    before = _recorded("arrow_repro")
    after = copy.deepcopy(before)
    after[0]["sustainable_rate"]["arrow"]["per_seed"] = [v * 0.9 for v in before[0]["sustainable_rate"]["arrow"]["per_seed"]]
    after[0]["sustainable_rate"]["vllm"]["per_seed"][0] += 1.0
    rows = {r["point"]: r for r in mc.compare("arrow_repro", before, after)}
    assert rows["azure-code arrow"]["changed"] and rows["azure-code arrow"]["diff"] < 0
    assert rows["azure-code vllm"]["changed"] and not rows["azure-code vllm"]["beyond"]  # one seed of three
    assert "scaling arrow x16" in rows and not rows["azure-code static-pd"]["changed"]


def test_the_recorded_command_runs_here_with_its_out_moved(mc, tmp_path):
    cmd = mc._command("cd /tmp/base34 && PYTHONPATH=/tmp/base34/src nice -n 19 /x/python bench/sim_claims.py "
                      "--points demo --seeds 3 --out /tmp/t34/sc_out", tmp_path, 0)
    assert cmd[0] == sys.executable
    assert cmd[1:] == ["bench/sim_claims.py", "--points", "demo", "--seeds", "3", "--out", str(tmp_path / "run0")]
