"""Scenario files: validation (one line naming flow and field) and runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laxflow.errors import UserError
from laxflow.sim.network.scenario import load_scenario, parse_scenario, run_scenario

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "table1.json"


def base() -> dict:
    return {
        "links": [{"id": "L", "capacity": 1.0}, {"id": "M", "capacity": 2.0}],
        "flows": [
            {"id": "A", "path": ["L"], "size": 2.0},
            {"id": "B", "path": ["L", "M"], "size": 1.0, "arrival": 0.5, "deadline": 4.0, "downstream": 1.0},
        ],
    }


def finishes(result: dict) -> dict:
    return {f["id"]: f["finish"] for f in result["flows"]}


@pytest.mark.parametrize(
    "policy, expect",
    [
        ("fs", {"A": 6.0, "C": 8.0, "B": 9.0}),
        ("sjf", {"A": 2.0, "C": 5.0, "B": 9.0}),
        ("edf", {"C": 3.0, "A": 7.0, "B": 9.0}),
    ],
)
def test_table1_exact(policy, expect):
    result = run_scenario(load_scenario(EXAMPLE), policy)
    assert finishes(result) == expect
    assert result["makespan"] == 9.0
    assert result["policy"] == policy
    due = {f["id"]: f["due"] for f in result["flows"]}
    assert due == {"A": 9.0, "B": 6.0, "C": 7.0}
    met = {f["id"]: f["met"] for f in result["flows"]}
    assert met == {k: expect[k] <= due[k] for k in expect}


def test_defaults_and_due():
    result = run_scenario(parse_scenario(base()), "fs")
    rows = {f["id"]: f for f in result["flows"]}
    assert rows["A"]["due"] is None and rows["A"]["met"] is None
    assert rows["B"]["due"] == 3.0
    # A alone 0..0.5 at 1, then both at 0.5 on L: B done at 2.5, A at 3.
    assert rows["B"]["finish"] == pytest.approx(2.5) and rows["B"]["met"] is True
    assert rows["A"]["finish"] == pytest.approx(3.0)


def test_met_uses_a_relative_tolerance():
    # 0.1 + 0.2 bytes at 1 byte/s finish at 0.30000000000000004, one ulp after
    # the due time 0.3: met within the 1e-9 relative tolerance.
    data = {"links": [{"id": "L", "capacity": 1.0}], "flows": [{"id": "A", "path": ["L"], "size": 0.1 + 0.2, "deadline": 0.3}]}
    row = run_scenario(parse_scenario(data), "fs")["flows"][0]
    assert row["finish"] > row["due"] and row["met"] is True
    data["flows"][0]["deadline"] = 0.2999999
    assert run_scenario(parse_scenario(data), "fs")["flows"][0]["met"] is False


def test_usage_object_for_a_flow_group():
    data = {
        "links": [{"id": "L", "capacity": 1.0}, {"id": "M", "capacity": 1.0}],
        "flows": [{"id": "G", "usage": {"L": 1.0, "M": 0.5}, "size": 4.0, "stage": "collective"}],
    }
    assert finishes(run_scenario(parse_scenario(data), "fs")) == {"G": 4.0}


def test_a_groups_pairs_make_it_the_bigger_job_for_sjf_group():
    # G: 8 pairs of 1 byte (8 bytes as a group) against K: one 2-byte flow on the same link.
    data = {
        "links": [{"id": "L", "capacity": 1.0}],
        "flows": [{"id": "G", "usage": {"L": 8.0}, "size": 1.0, "stage": "collective", "pairs": 8},
                  {"id": "K", "path": ["L"], "size": 2.0, "stage": "reuse"}],
    }
    scenario = parse_scenario(data)
    assert scenario.flows[0].build().pairs == 8.0 and scenario.flows[1].build().pairs == 1.0
    assert finishes(run_scenario(scenario, "sjf")) == {"G": 8.0, "K": 10.0}  # per pair: G is the small job
    assert finishes(run_scenario(scenario, "sjf-group")) == {"K": 2.0, "G": 10.0}  # whole: K goes first


def mutate(fn) -> dict:
    data = base()
    fn(data)
    return data


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["flows"][1].pop("size"), "flow 'B': field 'size' is required"),
        (lambda d: d["flows"][1].pop("path"), "flow 'B': exactly one of field 'path'"),
        (lambda d: d["flows"][1].update(path=["L", "X"]), "flow 'B': field 'path': unknown link 'X'"),
        (lambda d: d["flows"][1].update(path=[]), "flow 'B': field 'path' must be a non-empty list"),
        (lambda d: d["flows"][1].update(size=0), "flow 'B': field 'size' must be > 0"),
        (lambda d: d["flows"][1].update(size=-1.0), "flow 'B': field 'size' must be > 0"),
        (lambda d: d["flows"][1].update(size="big"), "flow 'B': field 'size' must be a number"),
        (lambda d: d["flows"][1].update(size=float("inf")), "flow 'B': field 'size' must be finite"),
        (lambda d: d["flows"][1].update(deadline=float("nan")), "flow 'B': field 'deadline' must be finite"),
        (lambda d: d["flows"][1].update(arrival=-1), "flow 'B': field 'arrival' must be >= 0"),
        (lambda d: d["flows"][1].update(id="A"), "flow 'A': field 'id' is a duplicate"),
        (lambda d: d["flows"][1].update(stage="decode"), "flow 'B': field 'stage': unknown stage 'decode'"),
        (lambda d: d["flows"][1].update(layer=-2), "flow 'B': field 'layer' must be a non-negative integer"),
        (lambda d: d["flows"][1].update(sise=1), "flow 'B': unknown field 'sise'"),
        (lambda d: d["flows"][1].update(pairs=0), "flow 'B': field 'pairs' must be > 0"),
        (lambda d: d["flows"][1].pop("id"), "flow #1: field 'id' is required"),
        (lambda d: d["links"][1].update(capacity=0), "link 'M': field 'capacity' must be > 0"),
        (lambda d: d["links"].append({"id": "L", "capacity": 1}), "link 'L': duplicate id"),
        (lambda d: d.pop("flows"), "field 'flows' must be a non-empty list"),
    ],
)
def test_bad_scenarios_name_flow_and_field(change, message):
    with pytest.raises(UserError) as info:
        parse_scenario(mutate(change), "s.json")
    text = str(info.value)
    assert text.startswith("s.json: ") and message in text
    assert "\n" not in text


def test_bad_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_scenario(bad)
    with pytest.raises(UserError, match="cannot read"):
        load_scenario(tmp_path / "missing.json")
    binary = tmp_path / "plot.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(UserError, match=r"plot.png: scenario file: not UTF-8 text \(byte 0\)"):
        load_scenario(binary)
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(base()).replace('"size": 2.0', '"size": NaN'))
    with pytest.raises(UserError, match="flow 'A': field 'size' must be finite"):
        load_scenario(nan)
