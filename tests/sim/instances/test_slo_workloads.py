"""The batching papers' workloads: SLOs, length statistics, burstiness, priorities, determinism."""

import numpy as np
import pytest

from laxflow.errors import UserError
from laxflow.sim.workload import generate
from laxflow.sim.workload.slo_traces import SLO_WORKLOADS, from_mean_p90, slo_of


def test_arrow_table1_slos():
    assert slo_of("azure-code") == (3.0, 0.1)
    assert slo_of("azure-conv") == (2.0, 0.15)
    assert slo_of("burstgpt") == (0.25, 0.075)
    assert slo_of("mooncake-clip") == (30.0, 0.1)


def test_lognormal_fit_hits_mean_and_p90():
    mu, sigma = from_mean_p90(892, 1776)
    x = np.random.default_rng(0).lognormal(mu, sigma, 200_000)
    assert abs(x.mean() / 892 - 1) < 0.02
    assert abs(np.percentile(x, 90) / 1776 - 1) < 0.02
    mu, sigma = from_mean_p90(688, 1599)  # beyond a lognormal's reach: the widest, mean kept
    x = np.random.default_rng(0).lognormal(mu, sigma, 400_000)
    assert abs(x.mean() / 688 - 1) < 0.03 and abs(np.percentile(x, 90) / 1599 - 1) < 0.05


@pytest.mark.parametrize("name", list(SLO_WORKLOADS))
def test_generated_lengths_rate_and_determinism(name):
    reqs = generate(name, 10.0, 4000, 3)
    assert reqs == generate(name, 10.0, 4000, 3)
    arr = np.array([r.arrival for r in reqs])
    assert arr[0] == 0 and np.all(np.diff(arr) >= 0)
    rate = (len(reqs) - 1) / arr[-1]
    assert 0.75 < rate / 10.0 < 1.33
    w = SLO_WORKLOADS[name]
    inp = np.mean([r.input_tokens for r in reqs])
    assert abs(inp / min(w.mean_input(), w.max_input) - 1) < 0.15
    assert all(r.output_tokens >= 1 for r in reqs)


def test_bursty_workload_is_burstier_than_poisson():
    def cv(name):
        arr = np.array([r.arrival for r in generate(name, 10.0, 6000, 1)])
        counts = np.histogram(arr, bins=np.arange(0, arr[-1], 6.4))[0]
        return counts.std() / counts.mean()

    assert cv("burstgpt") > 2 * cv("azure-conv")


def test_priorities_half_high_seeded():
    reqs = generate("qwen-trace", 5.0, 2000, 0)
    high = sum(r.category == "high" for r in reqs)
    assert 900 < high < 1100 and {r.category for r in reqs} == {"high", "low"}
    assert all(r.category is None for r in generate("azure-conv", 5.0, 50, 0))


def test_bad_rate_one_line():
    with pytest.raises(UserError, match="rate"):
        generate("burstgpt", 0.0, 10, 0)
