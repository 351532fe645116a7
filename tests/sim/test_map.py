"""``laxflow sim map``: cells and keys in JSON/CSV, resuming, one-line errors, plots, a user's row.

Tiny grids: one 8-GPU Mixtral-8x7B unit on 2 servers, 8 measured requests, 2 seeds, in-process runs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from laxflow.sim.map import output
from laxflow.sim.map.figures import cell_figures
from laxflow.sim.serving import experiment

TINY = ["--models", "mixtral-8x7b", "--servers", "2", "--workload", "qwen-agent", "--requests", "8", "--warmup", "2",
        "--seeds", "2", "--ep", "8", "--ep-comm", "hierarchical", "--kv-placements", "pool", "--remote-reuse", "router",
        "--prompt-scales", "1",
        "--loads", "0.8", "--jobs", "1", "--quiet"]


@pytest.fixture
def count_runs(monkeypatch) -> list:
    """Every run_one call of the in-process path, recorded (policy, seed)."""
    calls: list = []
    real = experiment.run_one

    def counting(spec, progress=None):
        calls.append((spec.policy, spec.seed))
        return real(spec, progress)

    monkeypatch.setattr(experiment, "run_one", counting)
    return calls


def test_cells_and_keys_in_json_and_csv_and_plot(laxflow_cli, tmp_path: Path, count_runs) -> None:
    js, cs, plots = tmp_path / "m.json", tmp_path / "m.csv", tmp_path / "plots"
    code, out, err = laxflow_cli("sim", "map", *TINY, "--nics", "50,200", "--json", str(js), "--csv", str(cs),
                                 "--plot", str(plots))
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["laxflow_map"] == output.FORMAT
    assert data["settings"]["seeds"] == [0, 1] and data["settings"]["requests"] == 8
    cells = data["cells"]
    # The base NIC (the deployment's 200) is on the axis: 2 cells, not 3.
    assert sorted(c["nic_gbps"] for c in cells) == [50.0, 200.0]
    assert len(count_runs) == 2 * 5 * 2
    for c in cells:
        assert c["row"] == "mixtral-8x7b" and c["ep"] == 8 and c["kv_placement"] == "pool" and c["load"] == 0.8
        assert c["seeds"] == [0, 1]
        assert set(c["policies"]) == {"fs", "sjf", "edf", "karuna", "mfs"}
        assert c["best_baseline"] in ("fs", "sjf", "edf", "karuna")
        assert set(c["paired_diff"]) == {"mean", "ci95", "excludes_0"}
        assert c["fs_cct_inflation"] >= 1.0 - 1e-9 and c["fs_cct_inflation_ci95"] is not None
        assert c["rate"] == pytest.approx(c["capacity"] * 0.8, rel=1e-3)
        best = c["policies"][c["best_baseline"]]["slo_attainment_seeds"]
        mfs = c["policies"]["mfs"]["slo_attainment_seeds"]
        assert c["paired_diff"]["mean"] == pytest.approx(sum(m - b for m, b in zip(mfs, best)) / 2, abs=1e-3)
    with cs.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and tuple(rows[0]) == output.CSV_COLUMNS
    png = plots / "map-mixtral-8x7b.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mixtral-8x7b" in out  # the table


def test_resume_skips_cells_already_in_the_file(laxflow_cli, tmp_path: Path, count_runs) -> None:
    js = tmp_path / "m.json"
    assert laxflow_cli("sim", "map", *TINY, "--nics", "200", "--json", str(js))[0] == 0
    assert len(count_runs) == 10
    first = json.loads(js.read_text())["cells"]
    code, _, err = laxflow_cli("sim", "map", *TINY, "--nics", "50,200", "--json", str(js))
    assert code == 0, err
    assert len(count_runs) == 20  # only the new cell ran: 5 policies x 2 seeds
    assert "1 already in" in err and "not re-run" in err
    cells = json.loads(js.read_text())["cells"]
    assert len(cells) == 2 and cells[0] == first[0]  # the old cell kept as it was
    code, _, err = laxflow_cli("sim", "map", *TINY, "--nics", "50,200", "--json", str(js))
    assert code == 0 and len(count_runs) == 20 and "2 already in" in err


def test_resume_refuses_a_file_of_other_settings(laxflow_cli, tmp_path: Path) -> None:
    js = tmp_path / "m.json"
    assert laxflow_cli("sim", "map", *TINY, "--nics", "200", "--json", str(js))[0] == 0
    code, _, err = laxflow_cli("sim", "map", *TINY, "--requests", "9", "--nics", "200", "--json", str(js))
    assert code == 2
    assert err.strip().count("\n") == 0 and "requests" in err and "another file" in err


def test_physics_sets_every_cells_choices_and_capacity_but_not_its_exchange(laxflow_cli, tmp_path: Path,
                                                                           count_runs) -> None:
    """--physics paper: the cells run with the paper's fairness, compute share and reuse and at the capacity
    under them; the exchange stays the cell's --ep-comm; a file of another physics is not resumed, one made
    before the flag existed resumes as faithful."""
    js = tmp_path / "m.json"
    code, _, err = laxflow_cli("sim", "map", *TINY, "--nics", "200", "--physics", "paper", "--json", str(js))
    assert code == 0, err
    assert "exchange stays the --ep-comm axis" in err
    doc = json.loads(js.read_text())
    assert doc["settings"]["physics"] == "fairness=group;comm_share=0.6;reuse_from=routed"
    (paper_cell,) = doc["cells"]
    assert paper_cell["ep_comm"] == "hierarchical"
    faithful = tmp_path / "f.json"
    assert laxflow_cli("sim", "map", *TINY, "--nics", "200", "--json", str(faithful))[0] == 0
    (faithful_cell,) = json.loads(faithful.read_text())["cells"]
    assert paper_cell["capacity"] > faithful_cell["capacity"]  # compute at 40 % of a layer, reuse credited
    code, _, err = laxflow_cli("sim", "map", *TINY, "--nics", "200", "--json", str(js))
    assert code == 2 and "physics" in err and "another file" in err
    old = json.loads(faithful.read_text())
    del old["settings"]["physics"]
    faithful.write_text(json.dumps(old))
    runs = len(count_runs)
    code, _, err = laxflow_cli("sim", "map", *TINY, "--nics", "200", "--json", str(faithful))
    assert code == 0 and "1 already in" in err and len(count_runs) == runs


@pytest.mark.parametrize("args, words", [
    (["--nics", "50,fast"], ["--nics", "positive numbers", "50,fast"]),
    (["--nics", "0"], ["--nics"]),
    (["--ep", "3"], ["--ep", "mixtral-8x7b", "3"]),
    (["--ep-comm", "pairwise-ish"], ["--ep-comm", "ep_comm", "pairwise-ish"]),
    (["--kv-placements", "cloud"], ["--kv-placements", "cloud", "pool"]),
    (["--remote-reuse", "1.5"], ["--remote-reuse", "[0, 1]", "router"]),
    (["--loads", "5"], ["--loads"]),
    (["--grid", "cube"], ["--grid", "star", "product"]),
    (["--physics", "vidur"], ["--physics", "vidur", "paper"]),
    (["--models", "gpt-9"], ["--models", "gpt-9"]),
    (["--policies", "mfs"], ["--policies", "baseline"]),
])
def test_a_bad_axis_value_is_one_clear_error(laxflow_cli, args: list, words: list) -> None:
    code, out, err = laxflow_cli("sim", "map", *TINY, "--dry-run", *args)
    assert code == 2, (out, err)
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    for w in words:
        assert w in line


def test_star_grid_count_and_dense_rows_keep_their_ep(laxflow_cli) -> None:
    code, out, err = laxflow_cli("sim", "map", "--models", "mixtral-8x22b,llama3-8b", "--dry-run")
    assert code == 0, err
    plan = json.loads(out)
    # Star: base + 4 other NICs + 2 other EPs + 1 exchange + 1 placement + 3 remote shares + 2 scales
    # + 5 loads; a dense model has no EP axis (base + 4 + 1 + 3 + 2 + 5).
    assert plan["cells"] == 19 + 16 and plan["runs"] == 35 * 5 * 3
    assert all("ep=1|" in k for k in plan["cell_keys"] if k.startswith("llama3-8b|mooncake-conv|"))
    code, out, _ = laxflow_cli("sim", "map", "--models", "mixtral-8x22b", "--grid", "product", "--dry-run")
    assert json.loads(out)["cells"] == 5 * 3 * 2 * 2 * 4 * 3 * 6


def test_a_users_cluster_from_config_is_its_own_row(laxflow_cli, tmp_path: Path) -> None:
    cfg = tmp_path / "mine.toml"
    cfg.write_text('nics = [100]\nseeds = 2\n[cluster]\nname = "mine"\nmodel = "mixtral-8x7b"\ngpu = "a800"\n'
                   'nic_gbps = 100\nservers = 2\nworkload = "qwen-agent"\n')
    code, out, err = laxflow_cli("sim", "map", "--config", str(cfg), "--loads", "0.8", "--ep", "8",
                                 "--ep-comm", "hierarchical", "--kv-placements", "pool", "--remote-reuse", "router",
                                 "--prompt-scales", "1", "--dry-run")
    assert code == 0, err
    plan = json.loads(out)
    assert list(plan["rows"]) == ["mine"] and plan["rows"]["mine"]["gpu"] == "a800"
    assert plan["rows"]["mine"]["nic_gbps"] == 100 and plan["seeds"] == [0, 1]
    assert plan["cell_keys"] == ["mine|qwen-agent|nic_gbps=100.0|ep=8|ep_comm=hierarchical|kv_placement=pool|"
                                 "remote_reuse=router|prompt_scale=1.0|load=0.8"]
    cfg.write_text('[cluster]\nmodel = "mixtral-8x7b"\nnic_gbps = "fast"\n')
    code, _, err = laxflow_cli("sim", "map", "--config", str(cfg), "--dry-run")
    assert code == 2 and "nic_gbps" in err and "\n" not in err.strip()


def test_figures_pick_the_best_baseline_and_mark_a_paired_margin() -> None:
    def row(policy, seed, att):
        return {"policy": policy, "seed": seed, "slo_attainment": att, "cct_inflation": 1.2, "ttft_mean": 0.1,
                "remote_reuse_share": 0.3, "wall_s": 1.0}

    rows = [row("fs", 0, 0.70), row("fs", 1, 0.50), row("fs", 2, 0.60),
            row("edf", 0, 0.80), row("edf", 1, 0.60), row("edf", 2, 0.70),
            row("mfs", 0, 0.85), row("mfs", 1, 0.66), row("mfs", 2, 0.74)]
    fig = cell_figures(rows, ["fs", "edf", "mfs"])
    assert fig["best_baseline"] == "edf"
    assert fig["paired_diff"]["mean"] == pytest.approx(0.05, abs=1e-4)
    assert fig["paired_diff"]["excludes_0"] is True  # +0.05, +0.06, +0.04: tight
    assert fig["fs_cct_inflation"] == pytest.approx(1.2)
    rows[6] = row("mfs", 0, 0.70)  # -0.10, +0.06, +0.04: the interval spans 0
    assert cell_figures(rows, ["fs", "edf", "mfs"])["paired_diff"]["excludes_0"] is False


def test_prompt_scale_scales_prompts_and_keeps_the_workload() -> None:
    from laxflow.sim.workload import generate, mean_input_tokens

    base = generate("qwen-conv", 1.0, 400, 0)
    double = generate("qwen-conv", 1.0, 400, 0, prompt_scale=2.0)
    assert 1.7 < mean_input_tokens(double) / mean_input_tokens(base) < 2.3
    assert [r.arrival for r in base] == [r.arrival for r in double]
    from laxflow.errors import UserError

    with pytest.raises(UserError, match="prompt_scale"):
        generate("qwen-multislo", 1.0, 10, 0, prompt_scale=2.0)


def test_paired_margin_needs_two_seeds_and_mfs() -> None:
    from laxflow.sim.map.figures import paired_margin

    one = {0: {"fs": {"slo_attainment": 0.5}, "mfs": {"slo_attainment": 0.9}}}
    assert paired_margin(one, [0]) == ("fs", pytest.approx(0.4), None, False)  # one seed: no interval, no mark
    assert paired_margin({0: {"fs": {"slo_attainment": 0.5}}}, [0]) is None


def test_remote_reuse_steers_how_much_reuse_is_fetched_remotely() -> None:
    """The --remote-reuse knob: 0 sends every request with a cached prefix to its holder, 1 away from it."""
    from laxflow.sim.serving.config import ClusterConfig, ServingConfig
    from laxflow.sim.serving.experiment import RunSpec, run_one

    def share(knob):
        cfg = ServingConfig(model="mixtral-8x7b", cluster=ClusterConfig(servers=4), warmup=20, remote_reuse=knob)
        return run_one(RunSpec(cfg, "qwen-agent", 2.0, "fs", 80, 0))["remote_reuse_share"]

    low, high = share(0.0), share(1.0)
    assert low < 0.05 and high > 0.9, (low, high)
    with pytest.raises(Exception, match="remote_reuse"):
        ServingConfig(remote_reuse=1.5)


def test_a_tied_best_baseline_is_the_first_in_order() -> None:
    from laxflow.sim.map.figures import paired_margin

    # sjf and edf both average 0.445 (as summed: 0.44499999999999995 and 0.445): a tie, sjf comes first.
    by_seed = {0: {"sjf": {"slo_attainment": 0.415}, "edf": {"slo_attainment": 0.405}, "mfs": {"slo_attainment": 0.38}},
               1: {"sjf": {"slo_attainment": 0.475}, "edf": {"slo_attainment": 0.485}, "mfs": {"slo_attainment": 0.485}}}
    assert paired_margin(by_seed, [0, 1])[0] == "sjf"
