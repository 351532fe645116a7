"""bench/testbed_ratio.py's aggregation over testbed runs (pure: no fabric needed)."""

from __future__ import annotations

import pytest

from bench_module import load_bench


def _bench():
    return load_bench("testbed_ratio")


def _run(ratio: float, on_cct: float, gate: float | None = None) -> dict:
    mode = {"cct_mean": 0.02, "cct_median": 0.018, "ttft_mean": 0.3, "slo_attainment": 1.0}
    on = dict(mode, cct_mean=on_cct)
    if gate is not None:
        on["a2a_gate_ms"] = gate
    return {"cct_ratio": ratio, "ttft_ratio": 2.0, "off": dict(mode), "static": dict(mode), "on": on}


def test_aggregate_gives_mean_t_interval_range_and_runs_at_target():
    out = _bench().aggregate([_run(1.2, 0.020, 1.0), _run(1.4, 0.018, 3.0), _run(1.5, 0.016, 2.0)])
    cct = out["cct_ratio"]
    assert out["runs"] == 3 and cct["per_run"] == [1.2, 1.4, 1.5]
    assert cct["mean"] == pytest.approx(4.1 / 3, abs=1e-4)
    # t(0.975, 2) = 4.303; sd of (1.2, 1.4, 1.5) = 0.1528
    assert cct["ci95"] == pytest.approx(4.3027 * 0.152753 / 3 ** 0.5, abs=1e-3)
    assert (cct["min"], cct["max"], cct["runs_at_target"], cct["target"]) == (1.2, 1.5, 2, 1.3)
    assert out["on"]["cct_mean_ms"]["per_run"] == [20.0, 18.0, 16.0]
    assert out["on"]["a2a_gate_ms"]["mean"] == pytest.approx(2.0)
    assert "a2a_gate_ms" not in out["static"]


def test_one_run_has_no_interval_and_runs_without_gate_times_report_none():
    out = _bench().aggregate([_run(1.3, 0.02)])
    assert out["cct_ratio"]["ci95"] is None and out["cct_ratio"]["runs_at_target"] == 1
    assert "a2a_gate_ms" not in out["on"]


def test_the_json_names_the_transport_and_spare_share_the_runs_used():
    as_run = _bench().as_run
    runs = [{"config": {"transport": "mooncake", "spare_share": None}}] * 2
    # testbed run resolved --transport auto and --spare-share 0 (strict): the runs' own config says so
    assert as_run(runs, "transport", "auto") == "mooncake" and as_run(runs, "spare_share", 0.0) is None
    assert as_run([], "transport", "auto") == "auto"  # no run came back: what was asked
