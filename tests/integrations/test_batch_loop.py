"""Every iteration scheduler driven by a toy step loop: all sequences finish, none starves, nothing leaks."""

from __future__ import annotations

import pytest

from laxflow.integrations.metrics import tdg_gain
from laxflow.integrations.prefill import BatchSample, SequenceView, batch_scheduler_names, create_batch_scheduler
from laxflow.integrations.prefill.iteration import BatchEntry

A, B, C = 0.005, 0.0002, 0.00001


def seconds(entries) -> float:
    return A + B * sum(n for n, _, _ in entries) + C * sum(k for _, k, _ in entries)


PROFILE = [BatchSample(s, seconds(s)) for s in (
    ((512, 0, True),), ((1, 300, False), (1, 900, False)), ((128, 256, True), (1, 2000, False)),
    ((2048, 0, True),), ((1, 100, False),), ((64, 4096, True), (1, 50, False)),
    ((300, 300, True), (200, 0, True)), ((1, 10, False), (1, 20, False), (1, 30, False)))]


def run(name: str, outputs: int = 5):
    """Four requests arriving 0-0.3 s, each wants ``outputs`` tokens; returns token times per request."""
    sched = create_batch_scheduler(name, PROFILE)
    pending = [SequenceView(f"r{k}", 0.1 * k, 0.5, 0.05, prompt_tokens=200 + 300 * k, weight=1.0 + k % 2)
               for k in range(4)]
    live: dict[str, SequenceView] = {}
    times: dict[str, list[float]] = {}
    now, steps = 0.0, 0
    while pending or live:
        while pending and pending[0].arrival <= now:
            seq = pending.pop(0)
            live[seq.id], times[seq.id] = seq, []
        if not live:
            now = pending[0].arrival
            continue
        batch = sched.schedule(list(live.values()), now)
        assert batch.entries, f"{name}: empty batch with {len(live)} live sequences"
        now += seconds(tuple((e.new_tokens, live[e.id].context, e.is_prefill) for e in batch.entries))
        for e in batch.entries:
            view = live[e.id].after(e)
            if view.output_tokens > live[e.id].output_tokens:
                times[e.id].append(now)
            live[e.id] = view
            if view.output_tokens == outputs:
                del live[e.id]
        steps += 1
        assert steps < 10_000
    return times


@pytest.mark.parametrize("name", batch_scheduler_names())
def test_all_sequences_finish(name):
    times = run(name)
    assert sorted(times) == ["r0", "r1", "r2", "r3"]
    assert all(len(t) == 5 and t == sorted(t) for t in times.values())
    # Light load: every scheduler meets every token deadline (TTFT 0.5 s, TPOT 50 ms).
    gains = [tdg_gain(0.1 * k, 0.5, 0.05, times[f"r{k}"]) for k in range(4)]
    assert gains == [5.0, 5.0, 5.0, 5.0]


def test_after_rejects_a_mismatched_entry():
    s = SequenceView("s", 0.0, 1.0, 0.1, prompt_tokens=10)
    assert s.after(BatchEntry("s", 4, True)).computed_tokens == 4
    assert s.after(BatchEntry("s", 10, True)).output_tokens == 1
    with pytest.raises(ValueError, match="does not fit"):
        s.after(BatchEntry("s", 11, True))


def test_recomputing_sequence_keeps_its_token_index():
    # Preempted after 3 outputs of a 100-token prompt: it rebuilds 103 tokens, then emits token 3.
    s = SequenceView("s", 0.0, 1.0, 0.1, prompt_tokens=103, output_tokens=3, folded_outputs=3)
    assert s.is_prefill and s.deadline() == pytest.approx(1.3)
    done = s.after(BatchEntry("s", 103, True))
    assert done.output_tokens == 4 and done.context == 103  # feeds token 3 over 100 + 3 cached
    plain = SequenceView("t", 0.0, 1.0, 0.1, prompt_tokens=100, computed_tokens=100, output_tokens=4)
    assert plain.context == done.context
    with pytest.raises(ValueError, match="folded_outputs"):
        SequenceView("x", 0.0, 1.0, 0.1, prompt_tokens=10, output_tokens=2)
