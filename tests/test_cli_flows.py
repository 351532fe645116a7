"""``laxflow sim flows`` as a user runs it: a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "table1.json"


def laxflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from laxflow.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_json_output_for_table1():
    proc = laxflow("sim", "flows", str(EXAMPLE), "--policy", "fs,sjf,edf", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [r["policy"] for r in out] == ["fs", "sjf", "edf"]
    finish = {r["policy"]: {f["id"]: f["finish"] for f in r["flows"]} for r in out}
    assert finish == {
        "fs": {"A": 6.0, "B": 9.0, "C": 8.0},
        "sjf": {"A": 2.0, "B": 9.0, "C": 5.0},
        "edf": {"A": 7.0, "B": 9.0, "C": 3.0},
    }
    assert out[0]["flows"][0] == {"id": "A", "finish": 6.0, "due": 9.0, "met": True}
    assert all(r["makespan"] == 9.0 for r in out)


def test_table_output():
    proc = laxflow("sim", "flows", str(EXAMPLE), "--policy", "edf")
    assert proc.returncode == 0, proc.stderr
    assert "policy edf" in proc.stdout and "deadlines met 2/3" in proc.stdout
    lines = [l for l in proc.stdout.splitlines() if l.strip("│ ").startswith(("A ", "B ", "C "))]
    assert [l.strip("│ ")[0] for l in lines] == ["C", "A", "B"]


def test_bad_file_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"links": [{"id": "L", "capacity": 1}], "flows": [{"id": "A", "path": ["Q"], "size": 1}]}))
    proc = laxflow("sim", "flows", str(bad), "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"laxflow: error: {bad}: flow 'A': field 'path': unknown link 'Q'"]


def test_unknown_policy_exits_2_before_running_anything():
    proc = laxflow("sim", "flows", str(EXAMPLE), "--policy", "fs,nope", "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "unknown policy 'nope'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_module_class_policy_name():
    proc = laxflow("sim", "flows", str(EXAMPLE), "--policy", "laxflow.policy.sjf:ShortestJobFirst", "--json")
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["policy"] == "laxflow.policy.sjf:ShortestJobFirst"
    assert {f["id"]: f["finish"] for f in result["flows"]} == {"A": 2.0, "B": 9.0, "C": 5.0}
