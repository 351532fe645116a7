"""FairBatching (Algorithm 1, PAB) and the Sarathi-style baselines on small hand-checked queues."""

from __future__ import annotations

import pytest

from laxflow.integrations.prefill import (
    BatchSample,
    SequenceView,
    batch_scheduler_names,
    create_batch_scheduler,
    token_deadline,
)
from laxflow.integrations.prefill.fairbatching import FairBatching, FairBatchingConfig, prefill_admission_budget
from laxflow.integrations.prefill.latency import LinearBatchModel

A, B, C = 0.01, 0.001, 0.0001  # 10 ms per step, 1 ms per new token, 0.1 ms per context token
MODEL = LinearBatchModel(A, B, C)


def profile() -> list[BatchSample]:
    """Steps of a mixed shape timed on an exact linear cost (what the simulator's profile gives)."""
    shapes = [((512, 0, True),), ((1, 300, False), (1, 900, False)), ((128, 256, True), (1, 2000, False)),
              ((2048, 0, True),), ((1, 100, False),), ((64, 4096, True), (1, 50, False), (1, 70, False))]
    return [BatchSample(s, A + B * sum(n for n, _, _ in s) + C * sum(k for _, k, _ in s)) for s in shapes]


def seqs() -> list[SequenceView]:
    """now = 10, TTFT 1 s, TPOT 0.1 s: slacks d1 0.1, d2 1.0, p1 0.5, p2 0.8."""
    return [
        SequenceView("d1", 9.0, 1.0, 0.1, prompt_tokens=100, computed_tokens=100, output_tokens=1),
        SequenceView("d2", 5.0, 1.0, 0.1, prompt_tokens=200, computed_tokens=200, output_tokens=50),
        SequenceView("p1", 9.5, 1.0, 0.1, prompt_tokens=300),
        SequenceView("p2", 9.8, 1.0, 0.1, prompt_tokens=1000),
    ]


def test_token_deadline_envelope():
    assert token_deadline(2.0, 1.0, 0.1, 0) == 3.0
    assert token_deadline(2.0, 1.0, 0.1, 5) == pytest.approx(3.5)
    s = seqs()
    assert [round(x.slack(10.0), 9) for x in s] == [0.1, 1.0, 0.5, 0.8]
    assert [x.context for x in s] == [100, 249, 0, 0]


def test_linear_model_fit_recovers_coefficients():
    m = LinearBatchModel.fit(profile())
    assert (m.a, m.b, m.c) == pytest.approx((A, B, C), rel=1e-6)
    with pytest.raises(ValueError, match="at least 3"):
        LinearBatchModel.fit(profile()[:2])


def test_groups_and_time_budget():
    fb = FairBatching(MODEL)
    budget, (urgent, prefill, other) = fb.groups(seqs(), 10.0)
    assert budget == pytest.approx(0.1)  # max(min slack 0.1, min TPOT 0.1)
    assert [s.id for s in urgent] == ["d1"]  # slack 0.1 < 0.1 + 0.1
    assert [s.id for s in prefill] == ["p1", "p2"]  # by slack
    assert [s.id for s in other] == ["d2"]


def test_algorithm1_chunks_the_prefill_that_does_not_fit():
    batch = FairBatching(MODEL).schedule(seqs(), 10.0)
    # 0.1 - a = 0.09 s: d1 costs 1 ms + 10 ms of context; p1 gets the 79 ms left = 79 tokens;
    # p2 and the non-urgent decode d2 wait.
    assert [(e.id, e.new_tokens, e.is_prefill) for e in batch.entries] == [("d1", 1, False), ("p1", 79, True)]
    assert batch.predicted_seconds == pytest.approx(0.1)
    assert batch.time_budget == pytest.approx(0.1)


def test_sufficient_capacity_takes_everything():
    relaxed = [SequenceView("d", 0.0, 1.0, 0.5, 10, 10, 3), SequenceView("p", 0.0, 1.0, 0.5, 20)]
    # slack 2.0 / 1.0 -> budget 1.0 s: both fit whole.
    batch = FairBatching(MODEL).schedule(relaxed, 0.0)
    assert [(e.id, e.new_tokens) for e in batch.entries] == [("p", 20), ("d", 1)]


def test_urgent_decodes_always_join_even_past_the_budget():
    # 12 decodes each 1 ms + 0.1 s of context (1,000 tokens): slack 0.05 s, TPOT 0.1 s ->
    # budget 0.1 s, all urgent; they cost 1.2 s, far past it, yet all run; the prefill waits.
    burst = [SequenceView(f"d{k:02d}", 0.0, 1.0, 0.1, 991, 991, 10) for k in range(12)]
    burst.append(SequenceView("p", 1.5, 1.0, 0.1, 100))
    batch = FairBatching(MODEL).schedule(burst, 1.95)
    assert batch.ids == [f"d{k:02d}" for k in range(12)]
    assert batch.predicted_seconds == pytest.approx(A + 12 * (B + 1000 * C))


def test_token_and_kv_caps():
    fb = FairBatching(MODEL, FairBatchingConfig(max_token_budget=30))
    assert [(e.id, e.new_tokens) for e in fb.schedule(seqs(), 10.0).entries] == [("d1", 1), ("p1", 29)]
    assert [(e.id, e.new_tokens) for e in FairBatching(MODEL).schedule(seqs(), 10.0, kv_free_tokens=5).entries] == \
        [("d1", 1), ("p1", 4)]


def test_sarathi_decode_first_static_budget():
    batch = create_batch_scheduler("sarathi", profile()).schedule(seqs(), 10.0)
    assert [(e.id, e.new_tokens) for e in batch.entries] == [("d2", 1), ("d1", 1), ("p1", 300), ("p2", 210)]
    assert batch.predicted_seconds == pytest.approx(A + B * 512 + C * 349)


def test_baseline_prefill_orders():
    q = [SequenceView("long", 0.0, 5.0, 0.1, 400, weight=1.0),
         SequenceView("tight", 0.5, 1.0, 0.1, 300, weight=1.0),
         SequenceView("vip", 1.0, 5.0, 0.1, 350, weight=2.0)]
    first = {n: create_batch_scheduler(n, profile()).schedule(q, 1.0).entries[0].id
             for n in ("sarathi", "edf", "sjf", "priority")}
    assert first == {"sarathi": "long", "edf": "tight", "sjf": "tight", "priority": "vip"}


def test_prefill_admission_budget_hand_checked():
    s = [seqs()[0], seqs()[2]]  # d1 slack 0.1 ctx 100, p1 slack 0.5 prompt 300
    # steps = (1 - 0.1)/0.1 + 1 = 10 -> 0.1 s of a; d1: 9 * 0.011, p1: 5 * 0.001 -> 0.104 s
    expected = (1.0 - 0.1 - 0.104) / (B + C) - 300
    assert prefill_admission_budget(s, 10.0, MODEL, 1.0, 0.1) == pytest.approx(expected)
    assert prefill_admission_budget([], 10.0, MODEL, 1.0, 0.1) == pytest.approx((1.0 - A) / (B + C))
    # More queued prefill -> less budget.
    assert prefill_admission_budget(seqs(), 10.0, MODEL, 1.0, 0.1) < expected


def test_bad_configurations_are_rejected():
    assert batch_scheduler_names() == ["edf", "fairbatching", "fairbatching-pab", "priority", "sarathi", "sjf",
                                       "slidebatching", "vllm", "weighted-vtc"]
    with pytest.raises(ValueError, match="unknown batch scheduler 'fair'.*fairbatching"):
        create_batch_scheduler("fair", profile())
    with pytest.raises(ValueError, match="FairBatchingConfig: unknown option 'token_budget'.*max_token_budget"):
        create_batch_scheduler("fairbatching", profile(), token_budget=5)
    with pytest.raises(ValueError, match="SarathiConfig.token_budget"):
        create_batch_scheduler("sarathi", profile(), token_budget=0)
    with pytest.raises(ValueError, match="computed_tokens"):
        SequenceView("x", 0.0, 1.0, 0.1, prompt_tokens=10, computed_tokens=11)
    with pytest.raises(ValueError, match="b > 0"):
        LinearBatchModel(0.0, 0.0, 0.0)
    assert FairBatching(MODEL).schedule([], 0.0).entries == ()
