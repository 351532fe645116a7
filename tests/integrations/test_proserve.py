"""ProServe: TDG, the batch latency estimator (Eq. 4-7) and SlideBatching (Algorithm 1), hand-checked."""

from __future__ import annotations

import pytest

from laxflow.integrations.metrics import TdgWeights, tdg_gain, tdg_ideal, tdg_ratio, token_weight
from laxflow.integrations.prefill import BatchSample, SequenceView, create_batch_scheduler
from laxflow.integrations.prefill.latency import ProServeLatencyModel
from laxflow.integrations.prefill.slidebatching import SlideBatching, SlideBatchingConfig

# prefill: 1 ms per token (c_p); decode: 1 ms + 0.1 ms per KV token; 10 ms per batch
COEF = dict(a_p=0.0, b_p=0.0, c_p=0.001, a_d=0.0001, b_d=0.001, t_c=0.01)
MODEL = ProServeLatencyModel(**COEF)


def profile(a_p=1e-8, b_p=2e-8) -> list[BatchSample]:
    def t(entries):
        pre = sum(a_p * n * n + b_p * n * k + COEF["c_p"] * n for n, k, p in entries if p)
        dec = sum(COEF["a_d"] * k + COEF["b_d"] for _, k, p in entries if not p)
        return pre + dec + COEF["t_c"]
    shapes = [((512, 0, True),), ((256, 512, True),), ((1, 300, False), (1, 900, False)),
              ((2048, 0, True), (1, 100, False)), ((1, 4000, False),), ((1024, 1024, True),),
              ((100, 0, True), (1, 10, False), (1, 20, False)), ((3000, 500, True),)]
    return [BatchSample(s, t(s)) for s in shapes]


def seqs() -> list[SequenceView]:
    """now = 10, TTFT 1 s, TPOT 0.1 s: remaining d1 0.1, d2 1.0, p1 0.5, p2 0.8; p2 has weight 2."""
    return [
        SequenceView("d1", 9.0, 1.0, 0.1, prompt_tokens=100, computed_tokens=100, output_tokens=1),
        SequenceView("d2", 5.0, 1.0, 0.1, prompt_tokens=200, computed_tokens=200, output_tokens=50),
        SequenceView("p1", 9.5, 1.0, 0.1, prompt_tokens=300),
        SequenceView("p2", 9.8, 1.0, 0.1, prompt_tokens=1000, weight=2.0),
    ]


def test_tdg_hand_checked():
    w = TdgWeights(w_p=3.0, w_d=1.0)
    # deadlines 1.0, 1.1, 1.2, 1.3: the third token (1.25) is late, the fourth (1.29) on time again.
    assert tdg_gain(0.0, 1.0, 0.1, [0.9, 1.05, 1.25, 1.29], priority_weight=2.0, weights=w) == pytest.approx(10.0)
    assert tdg_ideal(4, 2.0, w) == pytest.approx(12.0)
    assert tdg_ratio([10.0, 0.0], [12.0, 8.0]) == pytest.approx(0.5)
    assert token_weight(1, 2.0, w) == 6.0 and token_weight(2, 2.0, w) == 2.0
    assert tdg_gain(0.0, 1.0, 0.1, [1.0]) == 0.0  # strictly before the deadline
    with pytest.raises(ValueError, match="TdgWeights.w_d"):
        TdgWeights(1.0, -1.0)


def test_estimator_fit_and_online_correction():
    m = ProServeLatencyModel.fit(profile())
    assert (m.a_p, m.b_p, m.c_p, m.a_d, m.b_d, m.t_c) == pytest.approx((1e-8, 2e-8, 0.001, 0.0001, 0.001, 0.01), rel=1e-5)
    assert m.prefill(1000, 0) == pytest.approx(0.01 + 1.0)
    assert m.max_chunk(0, 5000, 0.5) == 497  # 1e-8 n^2 + 1e-3 n <= 0.5: 0.49947 at 497, 0.50048 at 498
    m.observe([0.22], [0.2])  # ran 10% slow: beta = 0.9 * 1 + 0.1 * 1.1
    assert m.beta == pytest.approx(1.01)
    assert m.decode(0) == pytest.approx(1.01 * 0.001)


def test_urgent_normal_split_phi_c():
    sb = SlideBatching(MODEL, SlideBatchingConfig(phi="c"))
    t_budget, urgent, normal = sb.judge(seqs(), 10.0)
    assert t_budget == pytest.approx(0.1)  # smallest remaining time (0.1) over eta
    # phi_c by remaining-time order d1, p1, p2, d2 with prefix sums x 0.1/0.09:
    # d1 0.012 (0.1 not below), p1 0.346 (0.5 not), p2 1.457 (0.8 below), d2 1.485 (1.0 below)
    assert [j.seq.id for j in urgent] == ["d2", "p2"]  # density 1/0.0259 > 2/1.0
    assert [j.seq.id for j in normal] == ["d1", "p1"]
    batch = sb.schedule(seqs(), 10.0)
    # t_c 0.01 + d2 0.0259 leaves 0.0641 s -> a 64-token chunk of p2; nothing else fits
    assert [(e.id, e.new_tokens) for e in batch.entries] == [("d2", 1), ("p2", 64)]
    assert batch.predicted_seconds == pytest.approx(0.0999)


def test_phi_a_marks_all_urgent_density_first():
    sb = SlideBatching(MODEL)  # colocated, phi_a
    _, urgent, normal = sb.judge(seqs(), 10.0)
    assert normal == [] and [j.seq.id for j in urgent] == ["d1", "d2", "p1", "p2"]
    assert [(e.id, e.new_tokens) for e in sb.schedule(seqs(), 10.0).entries] == [("d1", 1), ("d2", 1), ("p1", 53)]


def test_gamma_slides_the_boundary():
    loose = SlideBatching(MODEL, SlideBatchingConfig(gamma=0.05))  # gamma * phi_a = 0.074
    _, urgent, normal = loose.judge(seqs(), 10.0)
    assert urgent == [] and [j.seq.id for j in normal] == ["d1", "p1", "p2", "d2"]


def test_disaggregated_phi_p():
    q = [s for s in seqs() if s.is_prefill]
    sb = SlideBatching(MODEL, SlideBatchingConfig(setting="disaggregated"))
    t_budget, urgent, normal = sb.judge(q, 10.0)
    assert t_budget == pytest.approx(0.5)
    # phi_p = 0.3 + 1.0 + 2 * 0.01 = 1.32: both URGENT; density p1 1/0.3 > p2 2/1.0
    assert [j.seq.id for j in urgent] == ["p1", "p2"] and normal == []
    entries = sb.schedule(q, 10.0).entries
    assert entries[0].id == "p1" and entries[0].new_tokens == 300
    assert entries[1].id == "p2" and entries[1].new_tokens in (189, 190)  # 0.19 s left, float rounding
    assert [(e.id, e.new_tokens) for e in sb.schedule(q, 10.0, kv_free_tokens=100).entries] == [("p1", 100)]


def test_registry_and_bad_configurations():
    sb = create_batch_scheduler("slidebatching", profile(), setting="disaggregated", gamma=2.0)
    assert isinstance(sb, SlideBatching) and sb.config.gamma == 2.0
    with pytest.raises(ValueError, match="SlideBatchingConfig.setting: 'pd' is not one of colocated, disaggregated"):
        SlideBatchingConfig(setting="pd")
    with pytest.raises(ValueError, match="SlideBatchingConfig.phi: 'p' is not one of a, c"):
        SlideBatchingConfig(phi="p")
    with pytest.raises(ValueError, match="SlideBatchingConfig.eta"):
        SlideBatchingConfig(eta=0)
    with pytest.raises(ValueError, match="SlideBatchingConfig: unknown option 'alpha'.*gamma"):
        create_batch_scheduler("slidebatching", profile(), alpha=1.0)
    with pytest.raises(ValueError, match="at least 6"):
        ProServeLatencyModel.fit(profile()[:3])
