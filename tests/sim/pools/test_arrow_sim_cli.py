"""laxflow sim serve/sweep --pools: every pool manager runs on the instance engine, rows carry ``pools``."""

from __future__ import annotations

import json

ARGS = ["sim", "serve", "--workload", "azure-code", "--requests", "24", "--warmup", "0", "--jobs", "1", "--quiet",
        "--rate", "2"]


def test_serve_runs_every_pool_manager(laxflow_cli):
    code, out, err = laxflow_cli(*ARGS, "--pools", "arrow,static-pd,round-robin", "--instances", "2:2", "--json", "-")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert sorted(r["pools"] for r in rows) == ["arrow", "round-robin", "static-pd"]
    for r in rows:
        assert r["requests"] == 24 and r["instances"] == "2:2" and 0 <= r["slo_attainment"] <= 1
        assert r["tpot_p90"] > 0 and r["bytes_p2d"] > 0  # decodes moved over the network


def test_sweep_with_colocated_instance_count_and_bad_pools(laxflow_cli):
    code, out, err = laxflow_cli("sim", "sweep", "--workload", "azure-conv", "--requests", "12", "--warmup", "0",
                          "--jobs", "1", "--quiet", "--rates", "1,2", "--pools", "arrow", "--instances", "4")
    assert code == 0, err
    assert "arrow" in out
    code, out, err = laxflow_cli(*ARGS, "--pools", "arrow", "--instances", "1")
    assert code != 0 and "--pools arrow: needs at least 2 instances" in err and "Traceback" not in err
