"""``laxflow sim serve`` / ``sweep`` output: pipe-safe JSON, per-request rows, seeds with a CI, tables, plots."""

from __future__ import annotations

import csv
import json
import math

import pytest
from cli_runner import TINY, cli
from scipy import stats


def test_json_dash_writes_only_json_to_stdout_table_and_progress_to_stderr(capsys):
    code, out, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs,mfs", "--rate", "1", "--json", "-")
    assert code == 0, err
    data = json.loads(out)  # the whole of stdout is one JSON document
    assert [r["policy"] for r in data["results"]] == ["fs", "mfs"]
    assert "SLO att." in err and "ETA" in err  # the table and the progress bar (with its ETA) went to stderr


def test_sweep_json_dash_is_pipe_safe_too(capsys):
    code, out, err = cli(capsys, "sim", "sweep", *TINY, "--policies", "fs", "--rates", "0.5,1", "--json", "-",
                         "--quiet")
    assert code == 0, err
    data = json.loads(out)
    assert [r["rate"] for r in data["results"]] == [0.5, 1.0]
    assert "goodput" in err and "goodput" in data


def test_json_summary_carries_every_table_column(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, _, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs", "--rate", "1", "--json", str(out), "--quiet")
    assert code == 0, err
    row = json.loads(out.read_text())["results"][0]
    for key in ("ttft_p50", "nonoverlap_mean", "earliness_mean", "earliness_nonneg_mean", "cct_mean", "wall_s",
                "bytes_reuse", "bytes_collective", "bytes_p2d"):
        assert isinstance(row[key], (int, float)), key
    assert row["bytes_p2d"] > 0  # every request's KV goes to its decode unit


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_requests_out_has_one_row_per_measured_request_policy_and_seed(capsys, tmp_path, suffix):
    path, summary = tmp_path / f"req{suffix}", tmp_path / "r.json"
    code, _, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs,edf", "--rate", "2", "--seeds", "2",
                       "--requests-out", str(path), "--json", str(summary), "--quiet")
    assert code == 0, err
    if suffix == ".csv":
        with path.open() as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            r["met"] = r["met"] == "True"
            for k in ("ttft", "slo", "arrival", "bytes_p2d", "stall"):
                r[k] = float(r[k])
            r["seed"] = int(r["seed"])
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    from laxflow.sim.serving.export import REQUEST_COLUMNS

    assert list(rows[0]) == list(REQUEST_COLUMNS)
    assert len(rows) == 8 * 2 * 2  # measured requests x policies x seeds
    assert {(r["policy"], r["seed"]) for r in rows} == {("fs", 0), ("fs", 1), ("edf", 0), ("edf", 1)}
    results = {r["policy"]: r for r in json.loads(summary.read_text())["results"]}
    for policy, res in results.items():
        for i, seed in enumerate(res["seeds"]):
            mine = [r for r in rows if r["policy"] == policy and r["seed"] == seed]
            assert all(r["met"] == (r["ttft"] <= r["slo"] * (1 + 1e-12)) for r in mine)
            assert sum(r["met"] for r in mine) / len(mine) == pytest.approx(res["slo_attainment_seeds"][i])
            assert sum(r["ttft"] for r in mine) / len(mine) > 0
    assert all(r["bytes_p2d"] > 0 for r in rows)


def test_seeds_report_the_mean_and_a_t_interval(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, stdout, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs", "--rate", "3", "--seeds", "3",
                            "--json", str(out), "--quiet")
    assert code == 0, err
    data = json.loads(out.read_text())
    row = data["results"][0]
    att = row["slo_attainment_seeds"]
    assert data["config"]["seeds"] == row["seeds"] == [0, 1, 2]
    assert row["slo_attainment"] == pytest.approx(sum(att) / 3)
    sem = stats.tstd(att) / math.sqrt(3)
    assert row["slo_attainment_ci95"] == pytest.approx(stats.t.ppf(0.975, 2) * sem)
    assert f"{row['slo_attainment']:.3f} ± {row['slo_attainment_ci95']:.3f}" in stdout
    assert "3 seeds" in stdout


def test_a_seed_list_runs_exactly_those_seeds(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, _, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs", "--rate", "3", "--seeds", "4,7",
                       "--json", str(out), "--quiet")
    assert code == 0, err
    assert json.loads(out.read_text())["results"][0]["seeds"] == [4, 7]


def test_sweep_reports_goodput_per_seed_and_its_interval(capsys, tmp_path):
    out = tmp_path / "s.json"
    code, stdout, err = cli(capsys, "sim", "sweep", *TINY, "--policies", "fs", "--rates", "0.2,6", "--seeds", "2",
                            "--json", str(out), "--quiet")
    assert code == 0, err
    data = json.loads(out.read_text())
    per_seed = data["goodput_seeds"]["fs"]
    assert len(per_seed) == 2
    for seed, g in zip((0, 1), per_seed):  # each seed's goodput from its own rows
        rows = {r["rate"]: a for r in data["results"] for s, a in zip(r["seeds"], r["slo_attainment_seeds"])
                if s == seed}
        ok = [rate for rate, a in rows.items() if a >= 0.9]
        assert g == (max(ok) if ok else None)
    if None not in per_seed:
        assert data["goodput"]["fs"] == pytest.approx(sum(per_seed) / 2)
    assert "mean ± 95% CI over seeds" in stdout


def test_table_fits_columns_without_cutting_numbers(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "64")
    out = tmp_path / "r.json"
    code, stdout, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs", "--rate", "1", "--json", str(out),
                            "--quiet")
    assert code == 0, err
    assert max(len(line) for line in stdout.splitlines()) <= 64
    row = json.loads(out.read_text())["results"][0]
    for value in (f"{row['ttft_p99'] * 1e3:.1f}", f"{row['bytes_p2d'] / 1e9:.2f}", f"{row['cct_mean'] * 1e6:.0f}"):
        assert value in stdout  # split into parts, never truncated
    assert "(ms)" in stdout and "(GB)" in stdout and "(req/s/GPU)" in stdout


def test_table_parts_repeat_the_key_columns():
    from laxflow.sim.serving.report import table_parts

    point = {"policy": "karuna", "rate": 0.5, "slo_attainment": 0.5, "slo_attainment_ci95": 0.01234,
             "ttft_mean": 1.0, "ttft_p50": 1.0, "ttft_p90": 1.0, "ttft_p99": 123.0, "cct_mean": 1e-3,
             "nonoverlap_mean": 0.1, "earliness_mean": -0.2, "earliness_nonneg_mean": 0.1,
             "bytes_by_stage": {"reuse": 1e9, "collective": 2e12, "p2d": 3e9}, "wall_s": 12.0}
    wide = table_parts([point], 500)
    assert len(wide) == 1 and wide[0] == list(range(15))
    narrow = table_parts([point], 50)
    assert len(narrow) > 2 and all(part[:2] == [0, 1] for part in narrow)
    assert sorted(i for part in narrow for i in part[2:]) == list(range(2, 15))


def test_sweep_plot_labels_the_threshold_and_states_the_setup():
    from laxflow.sim.serving.plots import sweep_figure

    rows = [{"policy": "fs", "rate": r, "slo_attainment": a, "slo_attainment_ci95": 0.05} for r, a in
            ((0.5, 0.95), (1.0, 0.7))]
    meta = {"model": "m", "workload": "w", "servers": 16, "prefill_gpus": 64, "requests": 300, "seeds": [0, 1, 2]}
    fig = sweep_figure(rows, meta)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "0.9: goodput threshold" in labels and "fs" in labels
    assert "16 servers" in ax.get_title() and "300 measured requests" in ax.get_title() and "3 seeds" in ax.get_title()


def test_json_and_plot_into_a_missing_directory_create_it_and_say_so(capsys, tmp_path):
    out, plot = tmp_path / "new" / "r.json", tmp_path / "plots" / "r.svg"
    code, _, err = cli(capsys, "sim", "serve", *TINY, "--policies", "fs", "--rate", "1", "--json", str(out),
                       "--plot", str(plot), "--quiet")
    assert code == 0, err
    assert out.is_file() and plot.stat().st_size > 1000
    assert f"created directory {str(out.parent)!r} for --json" in err
    assert f"created directory {str(plot.parent)!r} for --plot" in err


def test_sim_list_prints_one_line_per_thing(capsys):
    from laxflow.policy.registry import available_policies
    from laxflow.sim.models import DEPLOYMENTS, MODELS
    from laxflow.sim.serving.experiment import PRESETS
    from laxflow.sim.workload import WORKLOADS

    for kind, names in (("models", MODELS), ("deployments", DEPLOYMENTS), ("workloads", WORKLOADS),
                        ("presets", PRESETS), ("policies", available_policies())):
        code, out, err = cli(capsys, "sim", "list", kind)
        assert code == 0, err
        lines = out.splitlines()
        assert [line.split()[0] for line in lines] == list(names)
        assert all(len(line.split(None, 1)) == 2 for line in lines)  # each says what it is
    code, out, err = cli(capsys, "sim", "list", "gpus")
    assert code == 2 and err.strip().splitlines() == [
        "laxflow: error: laxflow sim list: unknown 'gpus' (expected one of models, deployments, workloads, "
        "presets, policies)"]
