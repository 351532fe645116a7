"""FlowPrefill's metrics (goodput, tightest SLO scale), the 1P1D presets, and bench/flowprefill.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from laxflow.sim.serving import flowprefill_eval as fe
from laxflow.sim.serving.experiment import get_preset, prefill_gpus

ROOT = Path(__file__).parents[3]


@pytest.mark.parametrize("model,gpus", [("llama3-8b", 1), ("qwen2.5-14b", 2), ("llama3-70b", 4)])
def test_presets_are_one_prefill_instance_as_the_papers_1p1d(model, gpus):
    # FlowPrefill compares against DistServe 1P1D: one prefill instance. Several units behind a
    # load-aware router would send short requests around a blocked unit and hide FCFS's HoL blocking.
    from laxflow.sim.serving.simulator import ServingSimulator
    from laxflow.sim.workload.multislo import generate_multislo

    config = get_preset(f"flowprefill-{model}").config()
    assert prefill_gpus(config) == gpus
    sim = ServingSimulator(config, generate_multislo(1.0, 3, 0), "fs")
    assert len(sim.cluster.prefill_units) == 1 and len(sim.cluster.prefill_units[0].gpus) == gpus


def test_boundary_finds_the_largest_rate_that_holds():
    att = lambda r: 1.0 if r <= 3.3 else 0.5  # noqa: E731
    s = fe.boundary(att, 1.0, up=True, tol=0.01)
    assert 3.3 / 1.01 <= s.value <= 3.3
    assert all(a >= fe.THRESHOLD for x, a in s.probes if x <= s.value)
    s = fe.boundary(att, 10.0, up=True, tol=0.01)  # starts above the crossing: scans down
    assert 3.3 / 1.01 <= s.value <= 3.3 and s.probes[0] == (10.0, 0.5)


def test_boundary_finds_the_smallest_slo_scale_that_holds_and_reports_none():
    att = lambda x: 0.95 if x >= 0.42 else 0.2  # noqa: E731
    s = fe.boundary(att, 1.0, up=False, tol=0.01)
    assert 0.42 <= s.value <= 0.42 * 1.01
    never = fe.boundary(lambda x: 0.0, 1.0, up=True, limit=6)
    assert never.value is None and len(never.probes) == 6
    with pytest.raises(ValueError, match="step > 1"):
        fe.boundary(att, 1.0, up=True, step=1.0)


def test_flowprefill_beats_fcfs_on_one_instance_under_load():
    # Same requests, same rate: FCFS's long Search/File prefills block Text requests' 250 ms SLO.
    fp = fe.probe("llama3-8b", "flowprefill", 3.0, 1.0, 0, 120, 30)
    fcfs = fe.probe("llama3-8b", "fcfs", 3.0, 1.0, 0, 120, 30)
    assert fp["instance_rate"] == 3.0 and fp["rate"] == 3.0  # one GPU: instance rate = per-GPU rate
    assert fp["slo_attainment"] > fcfs["slo_attainment"]


def test_bench_prints_the_slo_scale_json():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "flowprefill.py"), "slo-scale", "--rate", "2", "--seeds", "1",
         "--requests", "30", "--warmup", "5", "--schedulers", "flowprefill,edf-cp2k", "--tol", "0.2"],
        capture_output=True, text=True, timeout=600, check=True,
    )
    data = json.loads(out.stdout)
    assert data["metric"] == "slo-scale" and data["rate"] == 2.0
    assert set(data["values"]) == {"flowprefill", "edf-cp2k"} and len(data["values"]["flowprefill"]) == 1
    for name, (value,) in data["values"].items():
        held = [x for x, a in data["probes"][name][0] if a >= 0.9]
        assert value == min(held)  # the smallest probed scale that held
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "flowprefill.py"), "slo-scale"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "needs --rate" in bad.stderr
