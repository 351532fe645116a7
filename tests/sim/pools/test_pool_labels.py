"""Pool runs' labels (router = the pool manager), flip counts (P->D, D->P) in the row, table and JSON,
the Arrow presets, and the configurations the CLI rejects with one line."""

from __future__ import annotations

import json

from laxflow.integrations.pools import Pool, PoolMove, create_pool_manager
from laxflow.integrations.prefill.base import TtftPredictor
from laxflow.sim.serving.pools_driver import PoolDispatcher

PROFILE = [(n, 1e-4 * n) for n in (1, 512, 1024, 2048, 4096)]
ARGS = ["sim", "serve", "--workload", "azure-code", "--requests", "24", "--warmup", "0", "--jobs", "1", "--quiet",
        "--rate", "2"]


def test_flip_counts_count_decisions_not_completion_edges():
    driver = PoolDispatcher(create_pool_manager("arrow", PROFILE, max_running_tokens=1000),
                            TtftPredictor(PROFILE, degree=2), {"a": Pool.PREFILL, "b": Pool.PREFILL, "c": Pool.DECODE},
                            0.1)
    for m in (PoolMove("a", Pool.PREFILL, Pool.P_TO_D),  # flip to decode (still prefilling)
              PoolMove("a", Pool.P_TO_D, Pool.DECODE),  # Figure 5's completion edge: no decision
              PoolMove("c", Pool.DECODE, Pool.D_TO_P),  # flip to prefill (still decoding)
              PoolMove("c", Pool.D_TO_P, Pool.PREFILL),  # completion edge
              PoolMove("b", Pool.PREFILL, Pool.DECODE),  # flip to decode (idle)
              PoolMove("b", Pool.DECODE, Pool.D_TO_P)):  # flip to prefill
        driver.table.apply(m, 0.0)
    st = driver.stats()
    assert (st["pool_flips"], st["flips_p2d"], st["flips_d2p"]) == (6, 2, 2)
    # End: a in D, b in D->P, c in P: two prefill-capable, one decode-capable.
    assert driver.result_keys() == {"flips_p2d": 2, "flips_d2p": 2, "pools_end": "2:1"}


def test_rows_carry_true_router_and_flip_counts(laxflow_cli, tmp_path):
    out = tmp_path / "r.json"
    code, text, err = laxflow_cli(*ARGS, "--pools", "arrow,vllm,vllm-disagg", "--instances", "8", "--json", str(out))
    assert code == 0, err
    rows = {r["pools"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"arrow", "vllm", "vllm-disagg"}
    for name, r in rows.items():
        assert (r["prefill"], r["router"], r["instances"]) == ("sarathi", name, "8")
        assert r["flips_p2d"] >= 0 and r["flips_d2p"] >= 0
    assert (rows["vllm"]["pools_end"], rows["vllm-disagg"]["pools_end"]) == ("1 colocated", "1:1")
    assert rows["vllm"]["bytes_p2d"] == 0 and rows["vllm-disagg"]["bytes_p2d"] > 0
    a = rows["arrow"]
    p, d = (int(x) for x in a["pools_end"].split(":"))
    assert p + d == 8
    assert "P>D/D>P" in text and "sarathi+arrow+fs" in text and "sarathi+arrow+arrow" not in text
    code, text, err = laxflow_cli(*ARGS, "--router", "dplb", "--instances", "8", "--json", "-")
    (r,) = json.loads(text)["results"]
    assert code == 0 and (r["router"], r["pools"]) == ("dplb", None)
    assert (r["flips_p2d"], r["flips_d2p"], r["pools_end"]) == (0, 0, None)  # no pools: no flip, no split
    assert "P>D/D>P" not in err  # nor the table's pool columns


def test_bad_pool_configurations_are_one_line(laxflow_cli):
    for extra, message in (
            (["--router", "dplb", "--pools", "arrow", "--instances", "4"],
             "--router dplb with --pools arrow: a pool manager dispatches its own requests; give one of them"),
            (["--pools", "vllm", "--instances", "4:4"], "--pools vllm: one colocated instance over all GPUs"),
            (["--pools", "vllm-disagg", "--instances", "3:5"], "--pools vllm-disagg: one prefill and one decode"),
            (["--pools", "vllm", "--instances", "16"], "one TP16 replica needs 16 GPUs in one node")):
        code, out, err = laxflow_cli(*ARGS, *extra)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1 and message in lines[0] and "Traceback" not in err, err


def test_arrow_presets_carry_their_engine_flags(laxflow_cli):
    code, out, err = laxflow_cli("sim", "list", "presets")
    names = [line.split()[0] for line in out.splitlines()]
    assert {"arrow-azure-code", "arrow-scale-2", "arrow-scale-4", "arrow-scale-16"} <= set(names)
    code, out, err = laxflow_cli("sim", "sweep", "--preset", "arrow-scale-4", "--requests", "12", "--jobs", "1",
                                 "--quiet", "--rates", "1", "--json", "-")
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["results"]
    assert sorted(r["pools"] for r in rows) == ["arrow", "static-pd"]
    assert all(r["instances"] == "4" and r["prefill"] == "sarathi" and r["requests"] == 12 for r in rows)
    # A flag on the line overrides the preset's.
    code, out, err = laxflow_cli("sim", "serve", "--preset", "arrow-azure-code", "--pools", "vllm", "--requests", "8",
                                 "--jobs", "1", "--quiet", "--rate", "1", "--json", "-")
    assert code == 0, err
    (r,) = json.loads(out)["results"]
    assert (r["pools"], r["instances"], r["router"]) == ("vllm", "8", "vllm")
