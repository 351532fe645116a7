"""``laxflow sim serve`` / ``sweep`` input: --config files, trace replay, and bad input as one line."""

from __future__ import annotations

import json

import pytest
from cli_runner import TINY, cli

from laxflow.errors import UserError, json_error, read_json_file, user_errors


def _one_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laxflow: error: "), err
    return lines[0]


def _trace(tmp_path, n: int = 6, gap: float = 2.0):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": gap * i, "input_length": 64 + 16 * i, "output_length": 4,
                                        "hash_ids": [7, 8] + [100 * i + k for k in range(2 + i)]}) + "\n"
                            for i in range(n)))
    return path


# -- --config ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix, text", [
    (".toml", 'model = "mixtral-8x7b"\nservers = 2\nworkload = "qwen-agent"\nrequests = 8\nwarmup = 2\n'
              'jobs = 1\npolicies = ["fs", "edf"]\nrate = 1.5\nslo-scale = 4\nquiet = true\n'),
    (".yaml", "model: mixtral-8x7b\nservers: 2\nworkload: qwen-agent\nrequests: 8\nwarmup: 2\njobs: 1\n"
              "policies: fs,edf\nrate: 1.5\nslo_scale: 4\nquiet: true\n"),
])
def test_config_file_fills_flags_and_the_command_line_wins(capsys, tmp_path, suffix, text):
    cfg, out = tmp_path / f"c{suffix}", tmp_path / "r.json"
    cfg.write_text(text)
    code, _, err = cli(capsys, "sim", "serve", "--config", str(cfg), "--requests", "6", "--json", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["config"]["model"] == "mixtral-8x7b" and data["config"]["slo_scale"] == 4.0
    assert [r["policy"] for r in data["results"]] == ["fs", "edf"]
    assert data["results"][0]["rate"] == 1.5
    assert data["results"][0]["requests"] == 6  # the flag, not the file's 8
    assert "simulating" not in err  # quiet from the file


@pytest.mark.parametrize("text, needle", [
    ('modle = "dbrx"\n', "unknown key 'modle' for sim serve (expected one of preset, model,"),
    ('rates = "0.5,1"\n', "unknown key 'rates' for sim serve"),
    ('requests = "ten"\n', "key 'requests': expected an integer, got 'ten'"),
    ("quiet = 1\n", "key 'quiet': expected true or false, got 1"),
    ("servers = \n", "not valid TOML"),
])
def test_bad_config_is_one_line(capsys, tmp_path, text, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    line = _one_line(*cli(capsys, "sim", "serve", "--config", str(cfg))[::2])
    assert f"--config: {str(cfg)!r}: " in line and needle in line


def test_config_file_must_be_toml_or_yaml(capsys, tmp_path):
    cfg = tmp_path / "c.ini"
    cfg.write_text("[x]\n")
    assert "expected a .toml, .yaml or .yml file" in _one_line(*cli(capsys, "sim", "sweep", "--config",
                                                                    str(cfg))[::2])


# -- traces ------------------------------------------------------------------------


def _serve_trace(capsys, tmp_path, *extra):
    out = tmp_path / "r.json"
    code, stdout, err = cli(capsys, "sim", "serve", "--model", "mixtral-8x7b", "--servers", "2", "--policies", "fs",
                            "--trace", str(_trace(tmp_path)), "--trace-format", "qwen-bailian", "--jobs", "1",
                            "--quiet", "--json", str(out), *extra)
    assert code == 0, err
    return json.loads(out.read_text()), stdout, err


def test_time_scale_compresses_the_trace_and_keeps_its_shape(capsys, tmp_path):
    own, _, _ = _serve_trace(capsys, tmp_path, "--requests", "4", "--warmup", "2")
    fast, _, _ = _serve_trace(capsys, tmp_path, "--requests", "4", "--warmup", "2", "--time-scale", "4")
    assert own["results"][0]["rate"] == pytest.approx(5 / 10.0 / 8)  # 6 requests over 10 s, 8 prefill GPUs
    assert fast["results"][0]["rate"] == pytest.approx(4 * 5 / 10.0 / 8)
    assert fast["config"]["time_scale"] == 4.0


def test_a_short_trace_warns_and_title_and_json_agree_on_the_measured_count(capsys, tmp_path):
    data, stdout, err = _serve_trace(capsys, tmp_path, "--requests", "100", "--warmup", "2")
    assert "warning: the trace has 6 requests, fewer than --requests 100 + --warmup 2; measuring its last 4" in err
    assert data["results"][0]["requests"] == data["config"]["requests"] == 4
    assert data["config"]["requested"] == 100 and data["config"]["trace_requests"] == 6
    assert "4 measured requests" in " ".join(stdout.split())  # the title may wrap


def test_a_trace_with_no_request_left_after_warmup_is_refused(capsys, tmp_path):
    line = _one_line(*cli(capsys, "sim", "serve", "--model", "mixtral-8x7b", "--servers", "2", "--trace",
                          str(_trace(tmp_path)), "--trace-format", "qwen-bailian", "--warmup", "6")[::2])
    assert "--warmup: 6 warm-up requests leave none of the trace's 6 to measure" in line


# -- bad input: one line, before anything runs -------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["--plot", "out.txt"], "--plot: 'out.txt': expected a file name ending in one of"),
    (["--requests", "1000000000"], "--requests: expected 1 to 1,000,000"),
    (["--requests", "900000", "--warmup", "200000"], "exceed the limit of 1,000,000 per run"),
    (["--jobs", "-1"], "--jobs: expected 0 (one per CPU) or a positive number"),
    (["--trace-format", "azure"], "--trace-format: only with --trace FILE"),
    (["--time-scale", "2"], "--time-scale: only with --trace FILE"),
    (["--seeds", "0"], "--seeds: expected a number of seeds from 1 to 1000"),
    (["--seeds", "1,x"], "--seeds: expected a number of seeds or comma-separated integer seeds"),
    (["--seeds", "1,1"], "--seeds: expected up to 1000 distinct seeds"),
    (["--requests-out", "rows.txt"], "--requests-out: 'rows.txt': expected a .csv or .jsonl file name"),
    (["--requests", "abc"], "laxflow sim serve: Invalid value for '--requests'"),
    (["--bogus"], "laxflow sim serve: No such option: --bogus"),
    (["--nic-gbps", "0"], "--nic-gbps: expected a positive number of Gbit/s, got 0.0"),
    (["--nic-gbps", "nan"], "--nic-gbps: expected a positive number of Gbit/s, got nan"),
])
def test_bad_flags_are_one_line(capsys, args, needle):
    assert needle in _one_line(*cli(capsys, "sim", "serve", "--quiet", *args)[::2])


def test_trace_flag_combinations_are_refused(capsys, tmp_path):
    trace = str(_trace(tmp_path))
    line = _one_line(*cli(capsys, "sim", "serve", "--trace", trace, "--trace-format", "qwen-bailian",
                          "--workload", "qwen-conv")[::2])
    assert "--workload: not with --trace" in line
    line = _one_line(*cli(capsys, "sim", "serve", "--trace", trace, "--trace-format", "qwen-bailian",
                          "--rate", "1", "--time-scale", "2")[::2])
    assert "--time-scale: not with --rate" in line
    line = _one_line(*cli(capsys, "sim", "sweep", "--trace", str(tmp_path), "--trace-format", "azure")[::2])
    assert f"--trace: {str(tmp_path)!r} is a directory" in line


def test_sweep_refuses_what_serve_refuses(capsys):
    assert "--jobs" in _one_line(*cli(capsys, "sim", "sweep", "--jobs", "-2")[::2])
    assert "--time-scale" in _one_line(*cli(capsys, "sim", "sweep", "--time-scale", "2")[::2])  # serve only


def test_a_jsonl_read_as_azure_is_not_pasted_whole(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 64, "output_length": 4,
                                 "hash_ids": list(range(400))}) + "\n")
    line = _one_line(*cli(capsys, "sim", "serve", *TINY[:4], "--trace", str(trace), "--trace-format", "azure")[::2])
    assert line == (f"laxflow: error: {trace}:1: missing column 'TIMESTAMP' (expected a header with TIMESTAMP, "
                    "ContextTokens, GeneratedTokens; found a JSON line, not a CSV header: is the trace format right?)")


def test_an_unterminated_string_does_not_read_at_at(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": "0')
    line = _one_line(*cli(capsys, "sim", "serve", *TINY[:4], "--trace", str(trace), "--trace-format",
                          "qwen-bailian")[::2])
    assert line.endswith(":1: not a JSON object (Unterminated string starting at column 15)")
    bad = tmp_path / "s.json"
    bad.write_text('{"a": "x')
    with pytest.raises(UserError) as info:
        read_json_file(bad, "scenario file")
    assert str(info.value).endswith("not valid JSON (Unterminated string starting at line 1 column 7)")


def test_json_error_and_user_errors_helpers():
    try:
        json.loads("[1,")
    except json.JSONDecodeError as exc:
        assert json_error(exc) == "Expecting value at line 1 column 4"
    with pytest.raises(UserError, match=r"^--policies: boom$"):
        with user_errors("--policies"):
            raise ValueError("boom")
    with pytest.raises(UserError, match=r"^boom$"):
        with user_errors():
            raise ValueError("boom")


def test_bare_group_still_prints_its_help(capsys):
    code, out, err = cli(capsys, "sim")
    assert "serve" in out + err and "list" in out + err


def test_load_trace_names_a_directory_as_one(tmp_path):
    from laxflow.sim.workload import load_trace

    with pytest.raises(UserError, match=r"is a directory, expected a trace file$"):
        load_trace(tmp_path, "mooncake")
