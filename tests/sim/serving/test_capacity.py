"""The capacity method (laxflow.sim.serving.capacity) against hand computations on tiny inputs."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.sim.serving import capacity as cap
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.plan import ModelRunner
from laxflow.sim.workload.request import Request


def test_full_steps_by_hand():
    # Least-loaded ranks: 0->r0, 1->r1, 2->r1 (5 > 3), 3->r0 (5 < 7), 4->r0 (7 = 7, lowest).
    # Budget 6: step 1 takes [0] and [1]; both queues still hold requests, so it is full.
    # Step 2 takes [3] and [2], emptying r1: not full, and the walk stops.
    assert cap.full_steps([5, 3, 4, 2, 6], ranks=2, budget=6) == [[[0], [1]]]
    # Budget 8: the first step empties r1 already.
    assert cap.full_steps([5, 3, 4, 2, 6], ranks=2, budget=8) == []


def test_capacity_batches_with_the_simulators_prefill_driver(monkeypatch):
    # Not a copy of the batching rule: capacity drives the simulator's PrefillDriver over the fcfs
    # scheduler, so a change to the simulator's FCFS rule shows in capacity's steps. Six 1-token requests
    # on 2 ranks (0, 2, 4 -> r0; 1, 3, 5 -> r1): a 100-token budget empties both queues in one step.
    from laxflow.integrations.prefill import fcfs

    assert cap.full_steps([1] * 6, ranks=2, budget=100) == []
    # Arrivals 0, 0, 0, 3 on one rank, 1 s steps: [0, 1, 2] run 0-1, [3] 3-4; window 0..3 -> busy 1/3.
    assert cap.busy_fraction([0.0, 0.0, 0.0, 3.0], [1] * 4, 1, 100, lambda i, r: 1.0) == pytest.approx(1 / 3)
    monkeypatch.setattr(fcfs, "fcfs_batch", lambda waiting, budget: list(waiting[:1]))
    assert cap.full_steps([1] * 6, ranks=2, budget=100) == [[[0], [1]], [[2], [3]]]
    # Patched to one request per step: 0, 1, 2 run 0-1, 1-2, 2-3 -> busy 1.0.
    assert cap.busy_fraction([0.0, 0.0, 0.0, 3.0], [1] * 4, 1, 100, lambda i, r: 1.0) == pytest.approx(1.0)


def test_busy_fraction_by_hand():
    # One rank, every step 1 s. Steps: [0] 0-1, [1] 1-2 (arrived 0.5), idle 2-3, [2] 3-4, [3] 4-5
    # (arrived 3.2), idle until 10, [4] 10-11 (after the window). Window 0..10 (warm-up 10 % of 5 is
    # request 0), busy 4 s of 10.
    arrivals = [0.0, 0.5, 3.0, 3.2, 10.0]
    calls = []

    def step(idx, ranks):
        calls.append(list(idx))
        return 1.0

    assert cap.busy_fraction(arrivals, [10] * 5, 1, 100, step) == pytest.approx(0.4)
    assert calls == [[0], [1], [2], [3], [4]]
    # A budget wide enough for two: [0] 0-1, then [1] alone 1-2, ... the same here; with a budget of 5
    # tokens each 10-token request still runs alone (never split).
    assert cap.busy_fraction(arrivals, [10] * 5, 1, 5, lambda i, r: 1.0) == pytest.approx(0.4)


def _req(i: int, tokens: int) -> Request:
    return Request(id=f"r{i}", arrival=float(i), input_tokens=tokens, output_tokens=1,
                   block_hashes=tuple(range(1000 * i, 1000 * i - (-tokens // 16))))


def test_full_batch_rate_by_hand():
    # Llama3-8B TP4 SP4: one rank, 16 GPUs. Four 5000-token requests, budget 8192: every step holds
    # one request; steps 1-3 leave requests waiting (full), step 4 empties the queue. So the rate is
    # 3 x 5000 tokens / (3 x T) / 5000 tokens per request / 16 GPUs = 1 / (16 T), T one
    # 5000-token step (its layers' compute plus idle collectives).
    reqs = [_req(i, 5000) for i in range(4)]
    c = cap.capacity("llama3-8b", "mooncake-agent", servers=8, reqs=reqs)
    runner = ModelRunner("llama3-8b", None)
    dep = runner.deployment
    cfg = ClusterConfig(servers=8).resolve(int(dep.gpus_per_node), float(dep.nic_gbps),
                                           float(dep.intra_node_gbps or 7200.0))
    cluster = Cluster(cfg, runner.unit_gpus)
    plan = runner.plan(cluster, cluster.prefill_units[0], [5000], [5000], [0])
    t = runner.num_layers * (plan.compute + plan.idle_cct(cfg.nvswitch_bytes_per_s))
    assert (c.ranks, c.unit_gpus, c.full_steps, c.mean_new_tokens) == (1, 16, 3, 5000)
    assert c.step_seconds == pytest.approx(t)
    assert c.full_batch_rate == pytest.approx(1 / (16 * t))
    # Under Poisson arrivals the unit is never faster than full batches.
    assert 0 < c.per_gpu_rate <= c.full_batch_rate


def test_reuse_credit_and_too_few_requests():
    # Request 1 repeats request 0's prompt: credited, it computes 1 token (one is always computed).
    reqs = [_req(0, 5000), _req(0, 5000), _req(1, 5000), _req(2, 5000)]
    reqs = [Request(id=f"x{i}", arrival=float(i), input_tokens=r.input_tokens, output_tokens=1,
                    block_hashes=r.block_hashes) for i, r in enumerate(reqs)]
    assert cap.capacity("llama3-8b", "mooncake-agent", servers=8, reqs=reqs).mean_new_tokens == 5000
    credited = cap.capacity("llama3-8b", "mooncake-agent", servers=8, reqs=reqs, credit_reuse=True)
    assert credited.mean_new_tokens == pytest.approx((3 * 5000 + 1) / 4)
    assert credited.full_steps == 2  # [0, 1] (5001 tokens) and [2]; [3] empties the queue
    with pytest.raises(UserError, match="no full step"):
        cap.capacity("llama3-8b", "mooncake-agent", servers=8, reqs=reqs[:1])


def test_table_matches_the_method_for_the_demo_pair():
    # CAPACITY is copied from bench/capacity.py; if the serving model changes, rerun it and update the table.
    from laxflow.sim.serving.experiment import CAPACITY

    c = cap.capacity("mixtral-8x22b", "qwen-conv")
    assert float(f"{c.per_gpu_rate:.3g}") == CAPACITY[("mixtral-8x22b", "qwen-conv")]
