"""Request helpers: block tokens, the reuse statistic, re-timing a trace."""

from __future__ import annotations

import pytest

from laxflow.sim.workload import Request, prefix_reuse_fraction, summarize, with_poisson_arrivals


def req(i: int, t: float, n: int, hashes: tuple[int, ...]) -> Request:
    return Request(id=f"r{i}", arrival=t, input_tokens=n, output_tokens=1, block_hashes=hashes, block_size=4)


def test_block_tokens_last_block_partial() -> None:
    r = req(0, 0.0, 10, (1, 2, 3))
    assert r.num_blocks == 3
    assert [r.block_tokens(i) for i in range(4)] == [4, 4, 2, 0]


def test_reuse_is_by_prefix_in_arrival_order() -> None:
    reqs = [
        req(1, 1.0, 12, (1, 2, 5)),  # arrives second: reuses blocks 1, 2 -> 8 tokens
        req(0, 0.0, 10, (1, 2, 3)),  # first: nothing earlier
        req(2, 2.0, 12, (9, 2, 3)),  # block 2 was seen, but not after a seen block 9: a prefix cache reuses nothing
        req(3, 3.0, 6, (1, 2)),      # 4 + 2 tokens
    ]
    assert prefix_reuse_fraction(reqs) == pytest.approx((8 + 6) / (12 + 10 + 12 + 6))
    assert prefix_reuse_fraction([]) == 0.0


def test_with_poisson_arrivals_keeps_content_and_order() -> None:
    reqs = [req(i, float(10 - i), 8, (i,)) for i in range(200)]
    out = with_poisson_arrivals(reqs, rate=5.0, seed=1)
    assert [r.id for r in out] == [f"r{i}" for i in reversed(range(200))]
    assert out[0].arrival == 0.0 and all(b.arrival >= a.arrival for a, b in zip(out, out[1:]))
    assert summarize(out)["rate_per_s"] == pytest.approx(5.0, rel=0.2)
    assert out == with_poisson_arrivals(reqs, rate=5.0, seed=1)
    with pytest.raises(ValueError):
        with_poisson_arrivals(reqs, rate=0.0, seed=1)
