"""The fidelity bench end to end on a real fabric (root): calibration, the modes, the model's prediction.

Short and bounded (2 measured requests, 3 calibration probes per stage);
asserts what was measured and predicted is there and consistent, never
how close the two are (that is the bench's report, not a test).
"""

from __future__ import annotations

import os

import pytest

from laxflow.testbed import sim_model as sm
from laxflow.testbed.fabric import existing_namespaces
from laxflow.testbed.scenario import ScenarioConfig

from bench_module import load_bench

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="testbed needs root (network namespaces and qdiscs)")


def _bench():
    return load_bench("testbed_fidelity")


@root_only
def test_fidelity_run_measures_calibrates_and_predicts() -> None:
    name = f"fd{os.getpid() % 100000}"
    cfg = ScenarioConfig(name=name, requests=2, warmup=1, collective="tcp", modes=("off", "on"))
    run = _bench().one_run(cfg, reps=3)
    assert not [ns for ns in existing_namespaces() if ns.startswith(f"{name}-")]  # torn down
    calib = run["calibration"]
    assert calib["reps"] == 3 and set(calib["alone_ms"]) == {"1", "2", "3"}
    assert calib["sleep_ms"]["min"] >= cfg.compute_ms  # time.sleep never returns early
    for mode in ("off", "on"):
        params = run["params"][mode]
        for k, v in params["overhead_ms"].items():  # signed: alone time minus its bytes at goodput
            assert v == pytest.approx(calib["alone_ms"][k]["median"] - calib["model_alone_ms"][k], abs=0.01)
        assert params["compute_ms"] == pytest.approx(run["measured"][mode]["compute_ms_real"], abs=1e-3)
        base = {"overhead_s", "compute_s", "permit_s", "sendall_s", "skb_bytes"}
        assert base <= set(params["sources"]) <= base | {"window_segments"}  # cwnd: when every stage was sampled
        assert all(sm.MSS <= v <= 65536 for v in params["skb_bytes"].values())  # one frame .. a GSO packet
        for k in ("cct_mean", "ttft_mean"):
            assert run["rel_error"][mode][k] == pytest.approx(run["measured"][mode][k] / run["predicted"][mode][k] - 1)
    for side in ("predicted", "measured"):  # per layer: read in <= compute start <= all_to_all end <= write acked
        for mode in ("off", "on"):
            t = run[side][mode]["timeline_ms"]
            for j in range(cfg.layers):
                assert t["read"][j] <= t["compute"][j] <= t["a2a"][j] <= t["acked"][j], (side, mode, t)
    bench = _bench()
    for mode in ("off", "on"):  # the load figures: each side's TTFT growth, the model's TTFT on a 5 % faster/slower wire
        pred, meas = run["predicted"][mode], run["measured"][mode]
        assert pred["ttft_slope_ms_per_request"] == pytest.approx(bench.ttft_slope_ms(pred["ttft_per_request"]))
        assert meas["ttft_slope_ms_per_request"] == pytest.approx(bench.ttft_slope_ms(meas["ttft_per_request"]))
        band = pred["ttft_band_wire_5pct"]
        assert len(band) == 2 and all(b > 0 for b in band)
        assert meas["ttft_in_wire_band"] == (min(band) <= meas["ttft_mean"] <= max(band))
    on = run["params"]["on"]["permit_ms"]
    measured_wait = run["measured"]["on"]["permit_wait_ms_prefill"]
    assert on["1"] == pytest.approx(measured_wait["1"], abs=1e-3) and on["2"] == pytest.approx(measured_wait["2"], abs=1e-3)
    assert run["predicted"]["on"]["permit_dscp_prefill"]  # the model's daemons gave permits
    writes = 2 * (cfg.requests + cfg.warmup) * cfg.layers  # every KV write's decision, on both sides
    assert run["decisions"]["predicted"]["writes"] == run["decisions"]["measured"]["writes"] == writes
    holds = run["decisions"]["a2a_holds"]  # every all_to_all at the gate, on both sides, with its wait
    assert holds["predicted"]["collectives"] == holds["measured"]["collectives"] == writes
    assert all(0 <= h["waited_1ms"] <= writes and h["wait_ms"]["p50"] >= 0 for h in holds.values())
    measured_s3 = {k[3:]: v for k, v in run["measured"]["on"]["permit_dscp_prefill"].items() if k.startswith("s3:")}
    assert run["decisions"]["measured"]["dscp"] == measured_s3  # the testbed daemons' records match their permits


def test_load_figures_slope_and_wire_band_helpers() -> None:
    bench = _bench()
    assert bench.ttft_slope_ms([0.10, 0.12, 0.14, 0.16]) == pytest.approx(20.0)  # 20 ms more per request
    assert bench.ttft_slope_ms([0.3, 0.3, 0.3]) == pytest.approx(0.0)
    assert bench.ttft_slope_ms([0.3]) is None
    cfg = ScenarioConfig(rate="100mbit")
    from laxflow.testbed.fabric import parse_rate

    assert parse_rate(bench.wire_scaled(cfg, 0.95).rate) == 95_000_000
    assert parse_rate(bench.wire_scaled(cfg, 1.05).rate) == 105_000_000
    assert bench.wire_scaled(cfg, 1.05).kv_bytes == cfg.kv_bytes  # only the wire changes
