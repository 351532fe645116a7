"""vLLM's default scheduler, Weighted VTC and FairBatching-PAB's admission control, on hand-checked queues."""

from __future__ import annotations

import re

import pytest

from laxflow.errors import UserError
from laxflow.integrations.prefill import BatchEntry, SequenceView, create_batch_scheduler
from laxflow.integrations.prefill.fairbatching import FairBatchingConfig, FairBatchingPab
from laxflow.integrations.prefill.latency import LinearBatchModel
from laxflow.integrations.prefill.sarathi import SarathiConfig
from laxflow.integrations.prefill.vllm_default import VllmDefault, VllmDefaultConfig
from laxflow.integrations.prefill.vtc import WeightedVtc, WeightedVtcConfig
from laxflow.sim.serving.instances.decode import DecodeAllConfig

NOW = 10.0


def pre(id, prompt, arrival=9.0, weight=1.0, computed=0):
    return SequenceView(id, arrival, 0.5, 0.05, prompt, computed, 0, weight)


def dec(id, arrival=1.0, weight=1.0, prompt=100, outputs=3):
    return SequenceView(id, arrival, 0.5, 0.05, prompt, prompt, outputs, weight)


def ids(batch):
    return [(e.id, e.new_tokens) for e in batch.entries]


def test_vllm_default_prefills_whole_prompts_first_then_decodes():
    s = VllmDefault()
    queue = [dec("d1"), dec("d2", arrival=2.0), pre("p1", 3000, 5.0), pre("p2", 4000, 6.0), pre("p3", 2000, 7.0)]
    # Prefill-prioritized: whole prompts FCFS within 8192 tokens (3000 + 4000; + 2000 would be 9000), no decode.
    assert ids(s.schedule(queue, NOW)) == [("p1", 3000), ("p2", 4000)]
    # KV for the first prompt only: FCFS stops at the second.
    assert ids(s.schedule(queue, NOW, kv_free_tokens=3500)) == [("p1", 3000)]
    # No prompt fits the free KV: every decode runs instead.
    assert ids(s.schedule(queue, NOW, kv_free_tokens=2500)) == [("d1", 1), ("d2", 1)]
    # Nothing waiting: every decode, oldest first.
    assert ids(s.schedule([dec("d2", arrival=2.0), dec("d1")], NOW)) == [("d1", 1), ("d2", 1)]
    # A prompt over the token budget alone is still admitted whole (vLLM's budget = max_model_len).
    assert ids(s.schedule([pre("big", 10000, 1.0), pre("p", 10, 2.0)], NOW)) == [("big", 10000)]
    assert ids(VllmDefault(config=VllmDefaultConfig(max_num_seqs=1)).schedule(queue, NOW)) == [("p1", 3000)]


def test_weighted_vtc_serves_the_least_served_client_weighted():
    s = WeightedVtc()
    queue = [pre("h1", 100, 1.0, 2.0), pre("l1", 100, 2.0, 1.0), pre("h2", 100, 3.0, 2.0), pre("l2", 100, 4.0, 1.0)]
    # Counters 0/0 (tie: higher weight first); h1 charges 100/2 = 50, l1 100/1 = 100, h2 -> 100, tie -> l2.
    assert ids(s.schedule(queue, NOW)) == [("h1", 100), ("l1", 100), ("h2", 100), ("l2", 100)]
    assert s.counters == {2.0: 100.0, 1.0: 200.0}
    # Decodes first (w_out = 2 per token, / weight), then a started prefill, then new prompts; budget 8.
    s = WeightedVtc(config=WeightedVtcConfig(token_budget=8))
    batch = s.schedule([dec("dl", weight=1.0), dec("dh", arrival=2.0, weight=2.0), pre("run", 50, 0.5, 1.0, computed=10),
                        pre("new", 50, 0.1, 2.0)], NOW)
    assert ids(batch) == [("dl", 1), ("dh", 1), ("run", 6)]
    assert s.counters == {1.0: 2.0 + 6.0, 2.0: 1.0}


def test_weighted_vtc_lifts_a_returning_client():
    s = WeightedVtc(config=WeightedVtcConfig(token_budget=200))
    low = [pre(f"l{k}", 100, float(k), 1.0) for k in range(5)]
    assert ids(s.schedule(low, NOW)) == [("l0", 100), ("l1", 100)]  # low = 200
    # High arrives: lifted to the backlogged minimum (200), not 0, so it cannot take both slots.
    rest = low[2:] + [pre("h1", 100, 8.0, 2.0), pre("h2", 100, 9.0, 2.0)]
    assert ids(s.schedule(rest, NOW)) == [("h1", 100), ("l2", 100)]
    assert s.counters == {1.0: 300.0, 2.0: 250.0}


def test_fairbatching_pab_admits_within_the_budget_hand_checked():
    # a = 1/16 s, b = 1/1024 s per token, c = 0; TTFT 0.5625 s, TPOT 0.0625 s: exact in binary.
    s = FairBatchingPab(LinearBatchModel(0.0625, 2.0 ** -10, 0.0))

    def new(prompt):
        return SequenceView("n", NOW, 0.5625, 0.0625, prompt)

    # Empty instance: (TTFT - a) / (b + c) = 0.5 * 1024 = 512 tokens.
    assert s.admits([], NOW, new(512)) and not s.admits([], NOW, new(513))
    # One queued 100-token prompt with full slack (0.5625): one batch reserved (a), no decode work,
    # budget 512 - 100 = 412.
    held = [SequenceView("q", NOW, 0.5625, 0.0625, 100)]
    assert s.admits(held, NOW, new(412)) and not s.admits(held, NOW, new(413))
    # A decode due in 0.3125 s: (0.5625 - 0.3125) / 0.0625 + 1 = 5 batches -> 5a; it still needs
    # (0.5625 - 0.3125) / 0.0625 = 4 steps of b each; budget (0.5625 - 0.3125 - 4b) / b = 256 - 4 = 252.
    d = SequenceView("d", NOW - 0.25, 0.5625, 0.0625, 10, 10, 1)  # token 1 due at 9.75 + 0.5625 + 0.0625
    assert d.slack(NOW) == 0.375
    d = SequenceView("d", NOW - 0.3125, 0.5625, 0.0625, 10, 10, 1)
    assert d.slack(NOW) == 0.3125
    assert s.admits([d], NOW, new(252)) and not s.admits([d], NOW, new(253))
    assert s.schedule([d], NOW).entries == (BatchEntry("d", 1, False),)  # batches are FairBatching's


def test_bad_configurations_are_one_clear_line():
    from laxflow.sim.serving.instances import InstanceSimConfig

    for name, opts, expect in (
        ("vllm", {"max_num_seqs": 0}, "VllmDefaultConfig.max_num_seqs: must be an integer >= 1"),
        ("weighted-vtc", {"w_out": -1}, "WeightedVtcConfig.w_out: must be a finite number >= 0"),
        ("weighted-vtc", {"budget": 5}, "unknown option 'budget' (expected one of token_budget, w_in, w_out)"),
        ("fairbatching-pab", {"margin": 1}, "unknown option 'margin'"),
    ):
        with pytest.raises(ValueError, match=expect.replace("(", r"\(").replace(")", r"\)")):
            create_batch_scheduler(name, [], **opts) if name != "fairbatching-pab" else \
                FairBatchingPab.from_profile(_samples(), **opts)
    with pytest.raises(UserError, match="fairbatching-pab: admission by the prefill admission budget needs "
                                        "PD-colocated instances"):
        InstanceSimConfig(instances=2, prefill_instances=1, scheduler="fairbatching-pab")


@pytest.mark.parametrize("config, name, default", [
    (SarathiConfig, "token_budget", 512), (WeightedVtcConfig, "token_budget", 512), (DecodeAllConfig, "token_budget", 512),
    (FairBatchingConfig, "max_token_budget", 8192), (VllmDefaultConfig, "max_num_batched_tokens", 8192),
    (VllmDefaultConfig, "max_num_seqs", 256),
])
def test_token_counts_are_integers_of_at_least_one(config, name, default):
    """The one validation of token budgets (``iteration.check_count``): each error names its config and field."""
    assert getattr(config(), name) == default
    assert getattr(config(**{name: 1}), name) == 1
    for bad in (0, -3, 1.5, "8", None, True):
        with pytest.raises(ValueError, match=rf"^{config.__name__}\.{name}: must be an integer >= 1, got {re.escape(repr(bad))}$"):
            config(**{name: bad})


def _samples():
    from laxflow.sim.serving.instances.profile import profile_samples

    return profile_samples("llama3-8b-tp1-a800")
