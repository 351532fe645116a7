"""qwen-multislo: FlowPrefill Table 1's categories, calibrated."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.sim.workload import generate
from laxflow.sim.workload.multislo import CATEGORIES, category_slo, lognormal_params


def test_calibration_on_20k_requests():
    reqs = generate("qwen-multislo", 10.0, 20_000, 0)
    assert len(reqs) == 20_000
    for name, (mean, p99, share) in CATEGORIES.items():
        x = np.array([r.input_tokens for r in reqs if r.category == name])
        assert len(x) / len(reqs) == pytest.approx(share, abs=0.01)
        assert x.mean() == pytest.approx(mean, rel=0.06)  # file: ~800 samples of a heavy tail
        assert np.percentile(x, 99) == pytest.approx(p99, rel=0.1)
    gaps = np.diff([r.arrival for r in reqs])
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)


def test_lognormal_fit_and_slos():
    mu, sigma = lognormal_params(590.0, 3040.0)
    assert np.exp(mu + sigma**2 / 2) == pytest.approx(590.0)
    assert np.exp(mu + 2.3263478740408408 * sigma) == pytest.approx(3040.0)
    assert category_slo("llama3-8b", "text") == 0.25 and category_slo("llama3-70b", "file") == 18.0
    assert category_slo("mixtral-8x7b", "text") is None
    with pytest.raises(ValueError):
        lognormal_params(100.0, 50.0)
