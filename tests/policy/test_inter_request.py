"""Algorithm 1: examples, input validation, and a literal reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laxflow.errors import UserError
from laxflow.policy.inter_request import schedule
from laxflow.policy_cli import parse_problem
from laxflow.policy.red import robust_effective_deadline

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def laxflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from laxflow.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def load(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def test_issue_example():
    data = {"now": 0.0, "drop_budget": 2, "ports": {"p0": 100.0, "p1": 100.0},
            "batches": [{"id": "b1", "compute": 0.5,
                         "requests": [{"id": "r1", "deadline": 3.0, "load": {"p0": 50.0}}]}]}  # fmt: skip
    out = schedule(parse_problem(data)).as_json()
    assert out == {"order": ["b1"], "red": {"b1": 3.0}, "finish": {"b1": 1.0}, "pruned": []}


def test_piggyback_example_orders_the_globally_tighter_batch_first():
    out = schedule(parse_problem(load("inter_piggyback.json")))
    assert out.order == ["urgent", "mixed"]
    assert out.red == {"mixed": pytest.approx(7.75), "urgent": pytest.approx(3.1)}
    assert out.finish == {"urgent": pytest.approx(1.5), "mixed": pytest.approx(4.5)}
    assert out.pruned == []


def test_blackhole_example_prunes_the_doomed_request_and_saves_the_viable_batch():
    data = load("inter_blackhole.json")
    out = schedule(parse_problem(data))
    assert out.order == ["doomed", "viable"] and out.pruned == ["h1"]
    assert out.finish["viable"] == pytest.approx(1.5) and out.finish["viable"] <= 2.0
    data["drop_budget"] = 0
    unpruned = schedule(parse_problem(data))
    assert unpruned.pruned == [] and unpruned.finish["viable"] == pytest.approx(5.5)


def test_prunes_from_earlier_batch_when_it_holds_the_heaviest_load():
    data = {"ports": {"a": 1.0, "b": 1.0}, "drop_budget": 1, "batches": [
        {"id": "first", "requests": [{"id": "big", "deadline": 4.5, "load": {"a": 4.0}}]},
        {"id": "second", "requests": [{"id": "small", "deadline": 5.0, "load": {"a": 2.0}},
                                      {"id": "late", "deadline": 5.0, "load": {"b": 1.0}}]}]}  # fmt: skip
    out = schedule(parse_problem(data))
    assert out.order == ["first", "second"] and out.finish["first"] == 4.0
    # second alone behind first: (4 + 2) / 1 = 6 > 5; the heaviest load on 'a' is the earlier batch's
    assert out.pruned == ["big"]
    assert out.finish["second"] == pytest.approx(2.0)


def test_cli_json_and_table():
    proc = laxflow("policy", "inter", str(EXAMPLES / "inter_blackhole.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pruned"] == ["h1"]
    proc = laxflow("policy", "inter", str(EXAMPLES / "inter_piggyback.json"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.index("urgent") < proc.stdout.index("mixed") and "pruned (scavenger class): none" in proc.stdout


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ports": {"p0": 1.0}, "batches": [
        {"id": "b", "requests": [{"id": "r", "deadline": 1.0, "load": {"p9": 1.0}}]}]}))  # fmt: skip
    proc = laxflow("policy", "inter", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["laxflow: error: inter input: request 'r' names unknown port 'p9' (ports: p0)"]


def _base() -> dict:
    return {"ports": {"p0": 1.0}, "batches": [{"id": "b", "compute": 0.0,
            "requests": [{"id": "r", "deadline": 1.0, "load": {"p0": 1.0}}]}]}  # fmt: skip


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["ports"].update(p0=-1.0), "port 'p0' bandwidth must be > 0"),
        (lambda d: d["batches"][0]["requests"][0]["load"].update(p0=-2.0), "load on 'p0' must be >= 0"),
        (lambda d: d["batches"][0].update(requests=[]), "batch 'b' is empty"),
        (lambda d: d["batches"].append(dict(d["batches"][0])), "duplicate batch id 'b'"),
        (lambda d: d["batches"].append({"id": "c", "requests": d["batches"][0]["requests"]}), "duplicate request id 'r'"),
        (lambda d: d["batches"][0]["requests"][0].pop("deadline"), "request 'r' deadline must be a finite number"),
        (lambda d: d.update(drop_budget=-1), "'drop_budget' must be a non-negative integer"),
        (lambda d: d.update(ports={}), "'ports' must be a non-empty object"),
        (lambda d: d["batches"][0].update(compute=-1), "compute must be >= 0"),
    ],
)
def test_validation_names_what_is_wrong(mutate, message):
    data = _base()
    mutate(data)
    with pytest.raises(UserError, match=message):
        parse_problem(data)


# ---------------------------------------------------------------- reference


def reference(data: dict) -> tuple[list[str], dict[str, float], list[str]]:
    """Algorithm 1 exactly as the issue spells it, dense and slow."""
    ports = sorted(data["ports"])
    bw = np.array([data["ports"][p] for p in ports])
    batches = data["batches"]
    red = {b["id"]: robust_effective_deadline(r["deadline"] for r in b["requests"]) for b in batches}
    order = sorted(batches, key=lambda b: (red[b["id"]].red, b["id"]))
    vec = {r["id"]: np.array([r["load"].get(p, 0.0) for p in ports]) for b in batches for r in b["requests"]}
    S = np.zeros(len(ports))
    pool: dict[str, str] = {}  # request -> batch
    pruned: list[str] = []
    finish = {}
    for b in order:
        for r in b["requests"]:
            pool[r["id"]] = b["id"]
        L = sum((vec[r["id"]] for r in b["requests"] if r["id"] not in pruned), np.zeros(len(ports)))

        def est():
            return data.get("now", 0.0) + b.get("compute", 0.0) + float(np.max((S + L) / bw))

        f = est()
        while f > red[b["id"]].loose_min and len(pruned) < data["drop_budget"] and pool:
            u = int(np.argmax((S + L) / bw))
            loads = {r: vec[r][u] for r in pool}
            top = max(loads.values())
            if top <= 0:
                break
            r_star = min(r for r, v in loads.items() if v == top)
            pruned.append(r_star)
            if pool.pop(r_star) == b["id"]:
                L = L - vec[r_star]
            else:
                S = S - vec[r_star]
            f = est()
        finish[b["id"]] = f
        S = S + L
    return [b["id"] for b in order], finish, pruned


@st.composite
def problems(draw):
    n_ports = draw(st.integers(1, 4))
    ports = {f"p{i}": float(draw(st.sampled_from([1, 2, 4, 8]))) for i in range(n_ports)}
    batches = []
    rid = 0
    for b in range(draw(st.integers(1, 6))):
        reqs = []
        for _ in range(draw(st.integers(1, 4))):
            load = {p: float(draw(st.integers(0, 16))) for p in ports if draw(st.booleans())}
            reqs.append({"id": f"r{rid:02d}", "deadline": float(draw(st.integers(0, 24))), "load": load})
            rid += 1
        batches.append({"id": f"b{b}", "compute": float(draw(st.integers(0, 3))), "requests": reqs})
    return {"now": 0.0, "drop_budget": draw(st.integers(0, 5)), "ports": ports, "batches": batches}


@settings(max_examples=150, deadline=None)
@given(problems())
def test_matches_the_literal_algorithm_and_respects_the_budget(data):
    out = schedule(parse_problem(data))
    order, finish, pruned = reference(data)
    assert out.order == order
    assert out.pruned == pruned  # integer loads, power-of-two bandwidths: exact arithmetic
    assert out.finish == pytest.approx(finish)
    assert len(out.pruned) <= data["drop_budget"] and len(set(out.pruned)) == len(out.pruned)
    assert schedule(parse_problem(data)).as_json() == out.as_json()  # deterministic
