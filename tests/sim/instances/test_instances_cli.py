"""laxflow sim serve/sweep with --prefill batch schedulers, --router, --pools, --instances."""

from __future__ import annotations

import json

ARGS = ["sim", "serve", "--workload", "qwen-trace", "--requests", "16", "--warmup", "4", "--jobs", "1", "--quiet",
        "--rate", "3"]


def test_product_of_schedulers_and_routers_with_decode_keys(laxflow_cli):
    code, out, err = laxflow_cli(*ARGS, "--prefill", "fairbatching,sarathi", "--router", "pab,dplb",
                          "--instances", "2", "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    pairs = sorted((r["prefill"], r["router"]) for r in data["results"])
    assert pairs == [("fairbatching", "dplb"), ("fairbatching", "pab"), ("sarathi", "dplb"), ("sarathi", "pab")]
    for r in data["results"]:
        assert r["pools"] is None and r["policy"] == "fs" and r["requests"] == 16
        for key in ("tpot_p90", "tdg_gain", "tdg_ratio", "slo_attainment_high", "slo_attainment_low", "ttft_p99"):
            assert key in r
    assert data["config"]["router"] == ["pab", "dplb"] and data["config"]["instances"] == "2"
    assert data["config"]["rate_unit"] == "requests/s per instance"
    assert "fairbatching+pab+fs" in err  # the table goes to stderr with --json -


def test_disaggregated_sweep_goodput(laxflow_cli):
    code, out, err = laxflow_cli("sim", "sweep", "--workload", "burstgpt", "--requests", "12", "--warmup", "2",
                          "--jobs", "1", "--quiet", "--rates", "1,2", "--prefill", "slidebatching",
                          "--router", "gorouting", "--instances", "1:1")
    assert code == 0, err
    assert "slidebatching+gorouting+fs" in out and "goodput" in out


def test_bad_engine_flags_are_one_line(laxflow_cli):
    for extra, expect in (
        (["--router", "nope"], "--router: unknown 'nope'"),
        (["--pools", "nope"], "--pools: unknown 'nope'"),
        (["--prefill", "flowprefill", "--router", "pab"], "--prefill flowprefill: a prefill scheduler runs prefill "
                                                          "units, which only prefill: give --instances P:D"),
        (["--prefill", "flowprefill,sarathi", "--instances", "1:1"], "not both in one run"),
        (["--prefill", "fcfs", "--instances", "1:1", "--placement", "ports"], "not --placement ports --p2d layer"),
        (["--prefill", "fcfs", "--pools", "arrow", "--instances", "1:1"], "no --pools: a unit cannot flip"),
        (["--prefill", "fairbatching", "--instances", "2:0"], "--instances: expected N"),
        (["--prefill", "nope"], "--prefill: unknown 'nope'"),
    ):
        code, _, err = laxflow_cli(*ARGS, *extra)
        assert code != 0 and expect in err, (extra, err)
        assert len(err.strip().splitlines()) == 1
    code, _, err = laxflow_cli("sim", "serve", "--workload", "qwen-conv", "--prefill", "sarathi", "--quiet")
    assert code != 0 and "has no TPOT SLO" in err


def _one_to_one(laxflow_cli, *flags: str) -> tuple[dict, dict]:
    """(JSON config, the one result row) of a 1:1 disaggregated sarathi run with ``flags``."""
    code, out, err = laxflow_cli(*ARGS, "--prefill", "sarathi", "--instances", "1:1", *flags, "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    (row,) = data["results"]
    return data["config"], row


def test_network_choice_from_the_line_and_the_config_file(laxflow_cli, tmp_path):
    runs = {}
    for net in ("fabric", "ideal"):
        config, runs[net] = _one_to_one(laxflow_cli, "--network", net)
        assert config["network"] == net
    # The first token is seen when its KV lands on the decode instance: the transfer is in TTFT, free when ideal.
    assert runs["ideal"]["ttft_mean"] < runs["fabric"]["ttft_mean"]
    assert runs["ideal"]["network_bytes_by_stage"] == runs["fabric"]["network_bytes_by_stage"]
    cfg = tmp_path / "c.toml"
    cfg.write_text('network = "ideal"\ninstances = "1:1"\n')
    code, out, err = laxflow_cli(*ARGS, "--config", str(cfg), "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["network"] == "ideal" and data["results"][0]["tpot_mean"] == runs["ideal"]["tpot_mean"]


def test_bad_layout_flags_are_one_line(laxflow_cli):
    for extra, expect in (
        (["--instances", "1:1", "--network", "free"], "--network: unknown 'free' (expected one of fabric, ideal)"),
        (["--network", "ideal", "--workload", "qwen-conv"], "--network ideal: only the instance engine"),
        (["--instances", "1:1", "--p2d", "chunk"], "--p2d: unknown 'chunk' (expected one of prompt, layer)"),
        (["--instances", "1:1", "--placement", "rack"], "--placement: unknown 'rack' (expected one of ports, cluster)"),
        (["--p2d", "prompt", "--workload", "qwen-conv"], "--p2d prompt: only the instance engine"),
        (["--placement", "ports", "--workload", "qwen-conv"], "--placement ports: only the instance engine"),
    ):
        args = [*ARGS, *extra] if "--workload" not in extra else ["sim", "serve", "--quiet", *extra]
        code, _, err = laxflow_cli(*args)
        assert code != 0 and expect in err, (extra, err)
        assert len(err.strip().splitlines()) == 1


def test_config_file_takes_engine_keys(laxflow_cli, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('prefill = ["sjf"]\nrouter = "minload"\ninstances = "2"\n')
    code, out, err = laxflow_cli(*ARGS, "--config", str(cfg), "--json", "-")
    assert code == 0, err
    (r,) = json.loads(out)["results"]
    assert (r["prefill"], r["router"]) == ("sjf", "minload")


def test_requests_out_has_the_export_columns(laxflow_cli, tmp_path):
    import csv

    from laxflow.sim.serving.export import REQUEST_COLUMNS

    path = tmp_path / "r.csv"
    code, _, err = laxflow_cli(*ARGS, "--prefill", "sarathi", "--instances", "1:1", "--requests-out", str(path))
    assert code == 0, err
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 16 and list(rows[0]) == list(REQUEST_COLUMNS)
    assert {r["unit"] for r in rows} == {"0"} and {r["decode_unit"] for r in rows} == {"1"}
    assert all(int(r["outputs"]) >= 1 and float(r["max_tbt"]) >= float(r["tpot"]) >= 0 for r in rows)  # its decode


def test_azure_trace_runs_with_its_slo(laxflow_cli, tmp_path):
    trace = tmp_path / "azure.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{0.2 * i:.1f},{300 + 40 * i},{5 + i}" for i in range(12)]
    trace.write_text("\n".join(lines) + "\n")
    code, out, err = laxflow_cli("sim", "serve", "--trace", str(trace), "--trace-format", "azure", "--prefill",
                          "fairbatching", "--warmup", "2", "--jobs", "1", "--quiet", "--json", "-")
    assert code == 0, err
    (r,) = json.loads(out)["results"]
    assert r["requests"] == 10 and r["slo_mean"] == 2.0 and abs(r["tpot_slo"] - 0.15) < 1e-9  # azure -> azure-conv's SLO


def test_batching_presets_carry_engine_flags_and_are_listed(laxflow_cli):
    code, out, err = laxflow_cli("sim", "list", "presets")
    assert code == 0, err
    for name in ("fairbatching-single", "fairbatching-cluster", "proserve-single", "proserve-colocated",
                 "proserve-disaggregated"):
        assert name in out
    # ProServe's colocated multi-node run (Fig. 12): a flag on the line overrides the preset's list.
    code, out, err = laxflow_cli("sim", "serve", "--preset", "proserve-colocated", "--prefill", "weighted-vtc,vllm",
                                 "--requests", "16", "--warmup", "4", "--jobs", "1", "--quiet", "--json", "-")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert sorted((r["prefill"], r["router"], r["instances"]) for r in rows) == [
        ("vllm", "gorouting", "4"), ("vllm", "minload", "4"), ("weighted-vtc", "gorouting", "4"),
        ("weighted-vtc", "minload", "4")]
    assert all("slo_attainment_high" in r and "tdg_ratio" in r for r in rows)


def test_admission_control_from_the_cli(laxflow_cli):
    code, out, err = laxflow_cli("sim", "serve", "--preset", "fairbatching-single", "--prefill", "fairbatching-pab",
                                 "--rate", "30", "--requests", "60", "--warmup", "0", "--jobs", "1", "--quiet",
                                 "--json", "-")
    assert code == 0, err
    (r,) = json.loads(out)["results"]
    assert r["prefill"] == "fairbatching-pab" and 0 < r["rejected"] < 60 and r["requests"] == 60
    code, _, err = laxflow_cli(*ARGS, "--prefill", "fairbatching-pab", "--instances", "1:1")
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert "fairbatching-pab: admission by the prefill admission budget needs PD-colocated instances" in err


def test_nic_gbps_sets_the_instance_ports_and_the_unit_cluster(laxflow_cli):
    rows = {}
    for nic in ("200", "25"):
        config, rows[nic] = _one_to_one(laxflow_cli, "--nic-gbps", nic)
        assert config["nic_gbps"] == float(nic)
    # The same KV bytes through an 8x slower port: the first token is seen later.
    assert rows["25"]["network_bytes_by_stage"] == rows["200"]["network_bytes_by_stage"]
    assert rows["25"]["ttft_mean"] > rows["200"]["ttft_mean"]
    code, out, err = laxflow_cli("sim", "serve", "--quiet", "--model", "mixtral-8x7b", "--servers", "2",
                                 "--requests", "6", "--warmup", "0", "--jobs", "1", "--policies", "fs",
                                 "--nic-gbps", "50", "--json", "-")
    assert code == 0, err
    assert json.loads(out)["config"]["nic_gbps"] == 50.0


def test_p2d_and_placement_from_the_line(laxflow_cli):
    rows = {}
    for p2d, placement in (("prompt", "ports"), ("layer", "ports"), ("prompt", "cluster")):
        config, rows[p2d, placement] = _one_to_one(laxflow_cli, "--p2d", p2d, "--placement", placement,
                                                   "--servers", "2")
        assert (config["p2d"], config["placement"]) == (p2d, placement)
    base = rows["prompt", "ports"]
    assert rows["layer", "ports"]["ttft_mean"] < base["ttft_mean"]  # the KV mostly left while later layers computed
    assert rows["layer", "ports"]["network_bytes_by_stage"] == base["network_bytes_by_stage"]
    # Two TP1 instances on one 8-GPU server: the KV rides NVSwitch, not the network.
    assert rows["prompt", "cluster"]["network_bytes_by_stage"]["p2d"] == 0.0 < base["network_bytes_by_stage"]["p2d"]
