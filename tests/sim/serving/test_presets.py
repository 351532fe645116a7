"""Every preset still resolves and runs (issue 11 "Keep"), on its smallest cluster, with the new keys."""

from __future__ import annotations

from dataclasses import replace

import pytest

from laxflow.errors import UserError
from laxflow.sim.serving.experiment import PRESETS, RunSpec, prefill_gpus, run_one


def _smallest(preset):
    """The preset's config on the fewest servers (2, 4, 8, 16) that hold one prefill unit, 2 warm-up requests."""
    cfg = preset.config()
    for servers in (2, 4, 8, 16):
        small = replace(cfg, cluster=replace(cfg.cluster, servers=min(servers, preset.servers)), warmup=2)
        try:
            prefill_gpus(small)
            return small
        except UserError:
            continue
    raise AssertionError(f"{preset.name}: no prefill unit on 16 servers")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_at_its_top_rate_and_reports_the_fidelity_keys(name):
    preset = PRESETS[name]
    cfg = _smallest(preset)
    assert cfg.kv_placement == "pool"  # the paper's setting is every preset's default
    assert list(preset.rates) == sorted(preset.rates) and preset.rates[0] > 0
    row = run_one(RunSpec(cfg, preset.workload, preset.rates[-1], preset.policies[-1], 6, preset.seed))
    assert row["requests"] == 6 and 0.0 <= row["slo_attainment"] <= 1.0
    assert row["cct_inflation"] >= 1.0 - 1e-9  # never faster than the same layers on an idle fabric
    assert 0.0 <= row["remote_reuse_share"] <= 1.0 and 0.0 <= row["reuse_share"] < 1.0
