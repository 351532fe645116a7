"""One metrics row for both serving engines: every key of the union on every row, None where an engine has no value."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import RunSpec, get_preset, run_one
from laxflow.sim.serving.metrics import CONTRACT_KEYS, ROW_KEYS, RUN_KEYS, summarize
from laxflow.sim.serving.report import json_view, points, print_table

DECODE = ("tpot_attainment", "tpot_mean", "tpot_p50", "tpot_p90", "tpot_p99", "tbt_p50", "tbt_p99", "tbt_max",
          "max_tbt_attainment", "envelope_attainment", "token_deadline_attainment", "tdg_ratio", "effective_rps")


DECODE_MEASURED = ("tpot_mean", "tpot_p50", "tpot_p90", "tpot_p99", "tbt_p50", "tbt_p99", "tbt_max")


def _unit(policy: str, decode: str = "steps") -> RunSpec:
    cfg = ServingConfig(model="mixtral-8x7b", cluster=ClusterConfig(servers=2), warmup=2, decode=decode)
    return RunSpec(cfg, "qwen-agent", 1.0, policy, 8, 0)


def _instance(policy: str, **engine: str) -> RunSpec:
    return RunSpec(ServingConfig(warmup=2), "qwen-trace", 3.0, policy, 12, 0, prefill="sarathi", **engine)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    assert ServingConfig().decode == "steps"  # the unit engine decodes unless told to hold
    return {"unit-fs": run_one(_unit("fs")), "unit-mfs": run_one(_unit("mfs")),
            "unit-hold": run_one(_unit("fs", "hold")),
            "disagg-mfs": run_one(_instance("mfs", router="minload", instances="1:1")),
            "pools-fs": run_one(_instance("fs", pools="static-pd", instances="2"))}


def test_every_row_of_both_engines_carries_every_key_of_the_union_in_one_order(rows):
    assert ROW_KEYS[: len(CONTRACT_KEYS)] == CONTRACT_KEYS and len(set(ROW_KEYS)) == len(ROW_KEYS)
    for name, row in rows.items():
        assert list(row)[: len(ROW_KEYS)] == list(ROW_KEYS), name
        assert set(row) == set(ROW_KEYS) | set(RUN_KEYS), name


def test_unit_rows_measure_decode_but_judge_ttft_only_and_keep_their_own_meanings(rows):
    fs, mfs, hold = rows["unit-fs"], rows["unit-mfs"], rows["unit-hold"]
    assert all(hold[k] is None for k in DECODE)  # decode "hold": no decode iterations run
    assert hold["ttft_mean"] == fs["ttft_mean"]  # 2 servers: one decode unit, so the router has no choice
    for row in (fs, mfs, hold):
        assert row["ttft_attainment"] == row["slo_attainment"]  # TTFT is its only SLO
        assert all(row[k] is None for k in DECODE if k not in DECODE_MEASURED)  # no TPOT SLO to attain
        assert (row["rejected"], row["flips_p2d"], row["flips_d2p"], row["pools_end"]) == (0, 0, 0, None)
        assert (row["prefill"], row["router"], row["pools"], row["instances"], row["deferred"]) == (None,) * 5
        assert row["cct_mean"] > 0 and row["cct_inflation"] >= 1.0 - 1e-9  # EP all-to-alls (NVSwitch here)
    for row in (fs, mfs):  # decode steps: every output token timed on the decode unit
        assert all(row[k] > 0 for k in DECODE_MEASURED)
        assert row["tpot_p50"] <= row["tpot_p90"] <= row["tpot_p99"] and row["tbt_p50"] <= row["tbt_max"]
    assert fs["pruned"] is None and isinstance(mfs["pruned"], int)  # only MFS keeps a pruned set


def test_instance_rows_fill_the_unit_keys_from_their_own_physics(rows):
    disagg, pools = rows["disagg-mfs"], rows["pools-fs"]
    for row in (disagg, pools):
        assert row["cct_mean"] is None and row["cct_inflation"] is None  # no collective runs as a flow
        assert row["reuse_share"] == row["remote_reuse_share"] == row["nonoverlap_mean"] == 0.0
        assert row["bytes_by_stage"] == row["network_bytes_by_stage"]  # whole run, from the fabric
        assert row["bytes_by_stage"]["p2d"] > 0 and row["deferred"] is None
        assert row["earliness_p10"] <= row["earliness_p50"] <= row["earliness_p90"]
        assert row["batches"] > 0 and all(row[k] is not None for k in DECODE)
    assert (disagg["flips_p2d"], disagg["flips_d2p"], disagg["pools_end"]) == (0, 0, None)
    assert disagg["pruned"] == 0 and pools["pruned"] is None
    assert pools["pools_end"] == "1:1" and pools["flips_p2d"] >= 0


def test_one_json_and_one_table_over_rows_of_both_engines(rows, capsys):
    keys = [(r["rate"], name) for name, r in rows.items()]
    pts = points(list(rows.values()), keys)
    text = json.dumps([json_view(p) for p in pts], allow_nan=False)  # None is null; a NaN would be refused here
    back = json.loads(text)
    assert [p["cct_mean"] is None for p in back] == [False, False, False, True, True]
    assert [p["tpot_p90"] is None for p in back] == [False, False, True, False, False]
    import sys

    print_table(pts, "both engines", sys.stdout)
    out = capsys.readouterr().out
    assert "TPOT p90" in out and "pruned/" in out and "P>D/D>P" in out


def test_instance_summary_reads_bytes_pruned_and_flips_from_its_engine():
    from laxflow.sim.serving.instances.engine import InstanceEngine
    from laxflow.sim.serving.instances.metrics import summarize as old_path
    from laxflow.sim.serving.instances.run import engine_config
    from laxflow.sim.workload import generate

    assert old_path is summarize  # the instances module re-exports the one summary
    spec = _instance("mfs", router="minload", instances="1:1")
    engine = InstanceEngine(engine_config(spec), generate("qwen-trace", 6.0, 14, 0))
    result = engine.run()
    label = {"policy": "mfs", "pools": None}
    row = summarize(result, 3.0, label, engine=engine)
    assert row["network_bytes_by_stage"] == engine.fabric.delivered and engine.fabric.delivered["p2d"] > 0
    bare = summarize(result, 3.0, label)  # no engine: the P2D bytes it issued, which all landed
    assert bare["network_bytes_by_stage"] == row["network_bytes_by_stage"]
    assert bare["pruned"] is None and row["pruned"] == 0 and bare["flips_p2d"] == 0
    assert summarize(result, 3.0, {"policy": "mfs", "pools": "arrow"})["flips_p2d"] is None  # unknown without it
    with pytest.raises(TypeError, match="label"):
        summarize(result, 3.0)


def test_prefill_drivers_count_deferrals_and_mfs_its_pruned_requests():
    from laxflow.sim.serving.experiment import build_workload
    from laxflow.sim.serving.simulator import ServingSimulator

    # FlowPrefill 1P1D, overloaded, under MFS with pruning on: the pruned set reaches the drivers.
    preset = get_preset("flowprefill-llama3-8b")
    cfg = replace(preset.config(), warmup=20, prefill="flowprefill")
    pruning = "laxflow.sim.serving.prefill_driver:MfsPruning"
    spec = RunSpec(cfg, preset.workload, 6.0, pruning, 120, 0, prefill="flowprefill")
    sim = ServingSimulator(cfg, build_workload(spec), pruning)
    row = summarize(sim.run(), 6.0)
    assert row["prefill"] == "flowprefill"
    assert row["pruned"] == len(sim.policy.pruned_requests) > 0
    assert row["deferred"] == sum(d.deferrals for d in sim.drivers) > 0
