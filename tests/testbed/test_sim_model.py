"""The simulator's model of the contention scenario (the testbed's prediction)."""

from __future__ import annotations

import pytest

from laxflow.testbed.fabric import parse_rate
from laxflow.testbed.scenario import ScenarioConfig
from laxflow.testbed.sim_model import GOODPUT, low_load_ttft, predict, predict_modes


def test_uncontended_all_to_all_takes_its_bytes_over_the_line_rate() -> None:
    # reuse and KV tiny: nothing shares the all_to_all's links, so CCT = bytes / goodput
    cfg = ScenarioConfig(requests=2, layers=3, reuse_bytes=1, kv_bytes=1, compute_ms=5.0, interarrival_ms=500.0)
    out = predict(cfg, "fs")
    assert out["cct_mean"] == pytest.approx(cfg.a2a_bytes / (parse_rate(cfg.rate) / 8 * GOODPUT), rel=1e-6)
    assert out["ttft_mean"] >= cfg.layers * cfg.compute_ms / 1000


def test_contention_slows_the_all_to_all_and_both_policies_finish() -> None:
    cfg = ScenarioConfig(requests=4)
    out = predict_modes(cfg)
    uncontended = cfg.a2a_bytes / (parse_rate(cfg.rate) / 8 * GOODPUT)
    assert out["off"]["cct_mean"] > uncontended * 1.05
    for mode in ("off", "on"):
        assert 0 <= out[mode]["slo_attainment"] <= 1 and out[mode]["ttft_mean"] > 0


def test_slo_is_the_factor_times_the_low_load_ttft_and_mfs_protects_the_collective() -> None:
    cfg = ScenarioConfig(requests=6)
    low = low_load_ttft(cfg)
    assert cfg.ideal_ttft_s() <= low  # the sizes' bound ignores the ranks sharing the KV and decode ports
    out = predict_modes(cfg)
    assert out["off"]["slo_s"] == pytest.approx(cfg.slo_factor * low) == out["on"]["slo_s"]
    # The fluid model's MFS puts the all_to_all above the reads and defers the KV writes (MLU):
    # the collective is faster than under one class; the measured SLO given in is the one used.
    assert out["on"]["cct_mean"] < out["off"]["cct_mean"]
    assert predict_modes(cfg, slo=1.5)["on"]["slo_s"] == 1.5
