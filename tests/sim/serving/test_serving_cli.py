"""``laxflow sim serve`` / ``sweep`` as a user runs them, seed determinism, and the router's cache."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import RunSpec, run_one
from laxflow.sim.serving.router import GlobalRouter, PrefixCaches

CONTRACT = ["policy", "rate", "slo_attainment", "ttft_mean", "ttft_p90", "ttft_p99", "cct_mean", "earliness_mean",
            "requests"]
TABLE = ["ttft_p50", "nonoverlap_mean", "earliness_nonneg_mean", "bytes_reuse", "bytes_collective", "bytes_p2d",
         "wall_s"]
SMALL = ["--preset", "demo", "--requests", "12", "--warmup", "4", "--quiet", "--jobs", "1"]


def laxflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from laxflow.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=240)


def test_serve_json_has_the_contract_keys_first_and_every_table_column(tmp_path):
    out = tmp_path / "r.json"
    plot = tmp_path / "r.png"
    proc = laxflow("sim", "serve", *SMALL, "--policies", "fs,mfs", "--rate", "2", "--json", str(out),
                   "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert sorted(data) == ["config", "results"]
    assert [r["policy"] for r in data["results"]] == ["fs", "mfs"]
    for row in data["results"]:
        assert list(row)[: len(CONTRACT)] == CONTRACT  # keys are added, never renamed or moved
        assert set(TABLE) <= set(row)
        assert row["slo_attainment_ci95"] is None and row["seeds"] == [0]  # one seed: no interval
        assert {"cct_inflation", "remote_reuse_share", "reuse_share"} <= set(row)  # issue 11: in every run
        assert row["rate"] == 2.0 and row["requests"] == 12
        assert 0.0 <= row["slo_attainment"] <= 1.0
        assert 0 < row["ttft_mean"] <= row["ttft_p99"]
    assert data["config"]["model"] == "mixtral-8x22b" and data["config"]["warmup"] == 4
    assert plot.stat().st_size > 1000
    assert "SLO att." in proc.stdout


def test_sweep_prints_goodput_and_writes_rows(tmp_path):
    out = tmp_path / "s.json"
    proc = laxflow("sim", "sweep", *SMALL, "--policies", "fs", "--rates", "0.5,1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["rate"] for r in data["results"]] == [0.5, 1.0]
    for row in data["results"]:
        assert {"slo_attainment_ci95", "cct_inflation", "remote_reuse_share"} <= set(row)
    assert set(data["goodput"]) == {"fs"}
    assert "goodput" in proc.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--rate", "-1"], "--rate"),
        (["--policies", "fs,nope"], "nope"),
        (["--preset", "fig99"], "--preset"),
        (["--servers", "1"], "--servers"),
        (["--workload", "nope"], "--workload"),
        (["--model", "gpt-9"], "gpt-9"),
        (["--slo-scale", "0"], "--slo-scale"),
        (["--topology", "ring"], "--topology"),
        (["--servers", "4"], "--servers"),
        (["--trace", "/no/such/file", "--trace-format", "x"], "--trace"),
        (["--no-such-flag"], "No such option: --no-such-flag"),  # typer's usage box, as one line
    ],
)
def test_bad_flags_exit_2_with_one_line(args, needle):
    proc = laxflow("sim", "serve", "--quiet", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("laxflow: error:")


def _spec(seed: int, policy: str = "mfs") -> RunSpec:
    cfg = ServingConfig(model="mixtral-8x7b", cluster=ClusterConfig(servers=8, gpus_per_server=4), warmup=10)
    return RunSpec(cfg, "qwen-agent", 1.0, policy, 30, seed)


def test_same_seed_same_results_other_seed_other_results():
    a, b, c = run_one(_spec(3)), run_one(_spec(3)), run_one(_spec(4))
    for key in ("ttft_samples", "slo_samples", "cct_mean", "bytes_by_stage", "network_events"):
        assert a[key] == b[key]
    assert a["ttft_samples"] != c["ttft_samples"]


def test_prefix_cache_lengths_and_lru_eviction():
    caches = PrefixCaches(2, capacity_tokens=3 * 16)
    caches.insert(0, [1, 2, 3], 16)
    caches.insert(1, [1, 2], 16)
    assert caches.prefix_lengths([1, 2, 3, 4]) == {0: 3, 1: 2}
    caches.insert(0, [7], 16)  # evicts block 1 from unit 0: its chain no longer matches there
    assert caches.evicted == 1
    assert caches.prefix_lengths([1, 2, 3]) == {1: 2}


def test_router_prefers_the_holder_until_its_queue_outweighs_the_prefix():
    caches = PrefixCaches(2, 1600)
    caches.insert(1, list(range(10)), 16)
    router = GlobalRouter(2, 2, caches, overlap_weight=1.0)
    idle = router.route(list(range(12)), 16, 12 * 16, [0, 0], [0.0, 0.0])
    assert (idle.prefill, idle.local_tokens, idle.remote_tokens) == (1, 160, 0)
    busy = router.route(list(range(12)), 16, 12 * 16, [0, 16 * 100], [5.0, 0.0])
    assert (busy.prefill, busy.holder, busy.remote_tokens, busy.decode) == (0, 1, 160, 1)


def test_serve_replays_a_trace_file_at_its_own_timestamps(tmp_path):
    """A Qwen-Bailian JSONL trace the test writes: shared hash prefixes, 2 s apart, 8 prefill GPUs."""
    trace = tmp_path / "t.jsonl"
    lines = [
        {"timestamp": 2.0 * i, "input_length": 64 + 16 * i, "output_length": 4,
         "hash_ids": [7, 8] + [100 * i + k for k in range(2 + i)]}
        for i in range(6)
    ]
    trace.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    out = tmp_path / "r.json"
    proc = laxflow("sim", "serve", "--model", "mixtral-8x7b", "--servers", "2", "--policies", "fs",
                   "--trace", str(trace), "--trace-format", "qwen-bailian", "--requests", "4", "--warmup", "2",
                   "--quiet", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["results"][0]
    assert row["requests"] == 4
    assert row["rate"] == pytest.approx(5 / 10.0 / 8)  # 6 requests over 10 s on 8 prefill GPUs
    assert row["slo_attainment"] == 1.0  # 2 s apart on an idle cluster: nothing waits


def test_a_bad_trace_line_is_one_line_even_with_worker_processes(tmp_path):
    """Every policy's worker parses the trace; the first failure stops the rest
    quietly and the user sees the file, line and field once."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0.0, "input_length": 64, "output_length": 1, "hash_ids": [1]}) + "\n"
                     + json.dumps({"timestamp": 1.0, "output_length": 1}) + "\n")
    proc = laxflow("sim", "serve", "--model", "mixtral-8x7b", "--servers", "2", "--policies", "fs,sjf,edf,karuna,mfs",
                   "--jobs", "2", "--trace", str(trace), "--trace-format", "qwen-bailian", "--quiet")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"laxflow: error: {trace}:2: field 'input_length': expected an integer >= 1, got 'nothing (missing)'"
    ]


def test_worker_processes_return_the_same_rows_in_spec_order():
    from laxflow.sim.serving.experiment import run_all

    specs = [_spec(1, "fs"), _spec(1, "edf")]
    local = run_all(specs, jobs=1)
    ticks: list[int] = []
    pooled = run_all(specs, jobs=2, on_progress=ticks.append)
    assert sum(ticks) == 2 * 40  # every request of both runs, reported from the workers
    assert [r["policy"] for r in pooled] == ["fs", "edf"]
    for a, b in zip(local, pooled):
        assert {k: v for k, v in a.items() if k != "wall_s"} == {k: v for k, v in b.items() if k != "wall_s"}


def test_ray_runs_the_same_rows_as_local_processes():
    ray = pytest.importorskip("ray")
    from laxflow.sim.serving.experiment import run_all

    specs = [_spec(2, "fs"), _spec(2, "mfs")]
    try:
        remote = run_all(specs, ray_address="local")
    finally:
        ray.shutdown()
    local = run_all(specs, jobs=1)
    for a, b in zip(local, remote):
        assert {k: v for k, v in a.items() if k != "wall_s"} == {k: v for k, v in b.items() if k != "wall_s"}
