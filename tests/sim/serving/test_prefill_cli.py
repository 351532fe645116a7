"""laxflow sim serve --prefill: the product of prefill schedulers and flow policies, each result with its prefill key."""

from __future__ import annotations

import json

from cli_runner import cli

ARGS = ["sim", "serve", "--preset", "flowprefill-llama3-8b", "--requests", "20", "--warmup", "5", "--jobs", "1",
        "--quiet", "--rate", "2"]


def test_prefill_times_policies(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, stdout, err = cli(capsys, *ARGS, "--prefill", "flowprefill,edf-cp2k", "--policies", "fs,mfs",
                            "--json", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    pairs = sorted((r["prefill"], r["policy"]) for r in data["results"])
    assert pairs == [("edf-cp2k", "fs"), ("edf-cp2k", "mfs"), ("flowprefill", "fs"), ("flowprefill", "mfs")]
    assert data["config"]["prefill"] == ["flowprefill", "edf-cp2k"]
    assert "flowprefill+mfs" in stdout


def test_unknown_prefill_is_one_error(capsys):
    code, _, err = cli(capsys, *ARGS, "--prefill", "nope")
    assert code != 0
    assert "--prefill: unknown 'nope'" in err


def test_dispatch_flag(capsys, tmp_path):
    code, _, err = cli(capsys, *ARGS, "--dispatch", "fastest")
    assert code != 0 and "--dispatch: expected load or ttft" in err
    out = tmp_path / "d.json"
    code, _, err = cli(capsys, *ARGS, "--prefill", "flowprefill", "--dispatch", "ttft", "--json", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["config"]["dispatch"] == "ttft" and data["results"][0]["prefill"] == "flowprefill"
