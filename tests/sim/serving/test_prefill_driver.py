"""Scheduler-driven prefill units (--prefill): preemption points in simulated time, and the legacy path unchanged."""

from __future__ import annotations

import itertools

import pytest
from serving_factories import create_config, create_request, run

from laxflow.integrations.prefill.base import Boundary
from laxflow.sim.serving.prefill_driver import chunk_pieces, operator_fractions
from laxflow.sim.workload import Request

# TTFTs of this scenario under the legacy FCFS batch former, measured with the code before --prefill existed
# (commit 80fce77): the default path must stay bit-for-bit the same.
GOLDEN = [0.011652879885, 0.050691746034, 0.222970932882, 0.203177535122, 1.016837120334, 0.997043722574, 0.977250324814, 0.956059863374, 0.936473067854, 0.916423915854, 0.896679670094, 0.877092874574, 0.857043722574, 1.74636471641, 1.72522340697, 1.70563661145, 1.68584321369, 1.66574490969, 2.565407372298, 1.62615811417, 1.60636471641, 1.58527255897, 1.56568576345, 1.54553830745, 1.52574490969, 1.50630557017, 2.405309068298, 2.385515670538, 2.364374361098, 2.344787565578, 2.324689261578, 2.766373492895, 2.285102466058, 2.265309068298, 2.706993299615, 1.30527255897, 2.204738413578, 2.184689261578, 2.626373492895, 2.145358220298]


def test_default_path_unchanged():
    reqs = [create_request(i, 0.02 * i, 300 + 97 * (i % 7) * 13) for i in range(40)]
    _, res = run(create_config("mixtral-8x7b", servers=2), reqs, "fs")
    assert [round(s.ttft, 12) for s in res.states] == GOLDEN


def _one_unit(prefill: str):
    # One TP1 A800 prefill unit (1 GPU per server), so both requests meet on the same unit.
    return create_config("llama3-8b", servers=2, gpus_per_server=1, deployment="llama3-8b-tp1-a800",
                         prefill=prefill, slo_scale=1.0)


def _pair(long_tokens: int, short_at: float) -> list[Request]:
    return [Request(id="long", arrival=0.0, input_tokens=long_tokens, output_tokens=1, category="file"),
            Request(id="short", arrival=short_at, input_tokens=200, output_tokens=1, category="text")]


def _boundaries(sim, batch) -> list[float]:
    """Times of every operator boundary of an uninterrupted batch that starts at 0."""
    fr = batch.op_fractions
    lt = batch.plan.compute
    ends = list(itertools.accumulate(fr))
    return [(j + e) * lt for j in range(sim.runner.num_layers) for e in ends]


def test_flowprefill_preempts_at_the_next_operator_boundary():
    probe, _ = run(_one_unit("flowprefill"), _pair(16000, 100.0))
    lt = probe.batches[0].plan.compute
    fr = probe.batches[0].op_fractions
    at = (3 + fr[0] / 2) * lt  # inside layer 3's qkv_proj: the next boundary is its end, not a layer end
    sim, res = run(_one_unit("flowprefill"), _pair(16000, at))
    long, short = res.states
    bounds = _boundaries(sim, res.batches[0])
    expected = min(b for b in bounds if b >= at)  # the first operator end at or after the arrival
    assert expected == pytest.approx((3 + fr[0]) * lt)
    assert short.batch_start == pytest.approx(expected, abs=1e-9)
    assert [kind for _, kind in sim.drivers[0].scheduler.preemptions] == [Boundary.OPERATOR]
    assert short.finish < long.finish
    assert sim.drivers[0].scheduler.idle()
    # The long prefill resumed where it stopped: its compute ends one short batch later than alone.
    alone = res.batches[0].plan.compute * sim.runner.num_layers
    short_compute = res.batches[1].plan.compute * sim.runner.num_layers
    assert long.compute_end == pytest.approx(alone + short_compute, rel=1e-9)


def test_fcfs_never_preempts():
    sim, res = run(_one_unit("fcfs"), _pair(16000, 0.3))
    long, short = res.states
    assert short.batch_start == pytest.approx(long.compute_end)
    assert sim.drivers[0].scheduler.preemptions == []


def test_the_units_fcfs_batches_are_the_fcfs_schedulers_tasks():
    # One FCFS rule (integrations.prefill.fcfs.fcfs_batch): a one-rank unit without --prefill forms the
    # batches the fcfs scheduler's driver starts, at the same times, down to the last bit of every TTFT.
    reqs = [create_request(i, 0.01 * i, 300 + 97 * (i % 7) * 13) for i in range(60)]
    runs = [run(create_config("llama3-8b", servers=2, gpus_per_server=1, deployment="llama3-8b-tp1-a800",
                              prefill=prefill), reqs, "fs")[1] for prefill in (None, "fcfs")]
    unit, driven = ([([s.id for s in b.states], b.start) for b in r.batches] for r in runs)
    assert unit == driven and any(len(ids) > 1 for ids, _ in unit)
    assert [s.ttft for s in runs[0].states] == [s.ttft for s in runs[1].states]


def test_fcfs_batches_every_attention_dp_rank_and_same_instant_arrivals_together():
    # Mixtral-8x7B's prefill unit has 8 attention-DP ranks: fcfs is the only --prefill that batches over
    # ranks (the others need one), and it is what the unit runs without --prefill. Requests arriving at
    # one instant are told to the scheduler together, so they share a step.
    reqs = [create_request(i, 0.05 * (i // 4), 300 + 97 * (i % 7) * 13) for i in range(32)]
    runs = [run(create_config("mixtral-8x7b", servers=2, prefill=prefill), reqs, "fs") for prefill in (None, "fcfs")]
    (sim, default), (_, fcfs) = runs
    assert sim.runner.attn_dp == 8 and default.prefill is None and default.deferred is None
    assert [s.ttft for s in default.states] == [s.ttft for s in fcfs.states]
    first = default.batches[0]
    assert [s.id for s in first.states] == ["r0", "r1", "r2", "r3"]  # the four requests of t = 0
    assert sorted(s.rank for s in first.states) == [0, 1, 2, 3]  # each on its own (least loaded) rank


def test_edf_layer_switches_at_a_layer_end():
    sim, res = run(_one_unit("edf-layer"), _pair(16000, 0.3))
    _, short = res.states
    lt = res.batches[0].plan.compute
    layer_ends = [(j + 1) * lt for j in range(sim.runner.num_layers)]
    assert short.batch_start == pytest.approx(min(t for t in layer_ends if t >= 0.3), abs=1e-9)
    assert [kind for _, kind in sim.drivers[0].scheduler.preemptions] == [Boundary.LAYER]


def test_edf_cp2k_switches_only_at_a_chunk_end_and_pays_the_chunking():
    sim, res = run(_one_unit("edf-cp2k"), _pair(8000, 0.05))
    long, short = res.states
    batch = res.batches[0]
    assert len(batch.chunk_marks) == 3  # 8000 tokens = 4 chunks of <= 2048
    total = batch.plan.compute * sim.runner.num_layers
    first_chunk_end = batch.chunk_marks[0] * total
    assert short.batch_start >= first_chunk_end - 1e-9
    # ... at the first operator boundary at or after it, not later.
    bounds = _boundaries(sim, batch)
    assert short.batch_start == pytest.approx(min(b for b in bounds if b >= first_chunk_end - 1e-12), abs=1e-9)
    assert [kind for _, kind in sim.drivers[0].scheduler.preemptions] == [Boundary.CHUNK]
    # Chunking overhead: four passes cost the compute model more than one pass of the whole prompt.
    whole = sim.runner.plan(sim.cluster, sim.cluster.prefill_units[0], [8000], [8000], [0]).compute
    assert batch.plan.compute > whole


def test_operator_fractions_and_chunk_pieces():
    sim, _ = run(_one_unit("flowprefill"), _pair(1000, 10.0))
    fr = operator_fractions(sim.runner.model, [1000], [1000])
    assert len(fr) == 5 and sum(fr) == pytest.approx(1.0)
    m = sim.runner.model
    # gate_up is twice down (both N h ffn GEMMs, gate_up twice as wide).
    assert fr[3] == pytest.approx(2 * fr[4])
    assert fr[0] / fr[2] == pytest.approx((m.num_heads + 2 * m.num_kv_heads) / m.num_heads)
    assert chunk_pieces([(3000, 3000), (1500, 1600)], 2048) == [[(2048, 2048)], [(952, 3000), (1096, 1196)],
                                                               [(404, 1600)]]


def test_prefill_needs_one_attention_group():
    from laxflow.errors import UserError
    from laxflow.sim.serving.simulator import ServingSimulator

    config = create_config("mixtral-8x7b", servers=2, prefill="flowprefill")
    with pytest.raises(UserError, match="attn_dp"):
        ServingSimulator(config, [create_request(0, 0.0, 100)], "fs")


def test_a_suspended_batch_reports_the_layer_it_stopped_at_to_the_flow_policy():
    # Layer progress from the scheduler drives MFS's RLI: a preempted batch stays at the layer it stopped
    # in (``BatchRun.layer``, which every flow it issues or holds carries as ``current_layer``) and moves
    # on only once it resumes.
    from laxflow.sim.events import Priority
    from laxflow.sim.serving.simulator import ServingSimulator

    probe, _ = run(_one_unit("flowprefill"), _pair(16000, 100.0))
    lt, fr = probe.batches[0].plan.compute, probe.batches[0].op_fractions
    at = (3 + fr[0] / 2) * lt
    sim = ServingSimulator(_one_unit("flowprefill"), _pair(16000, at), "mfs")
    seen = []

    def look():
        long = sim.batches[0]
        seen.append((long.layer, len(sim.batches)))

    short_compute = 200 / 16000 * lt * sim.runner.num_layers  # short's compute is well under this
    for t in (at + 1e-6, at + short_compute / 4):
        sim.queue.push(t, Priority.TIMER, look)
    res = sim.run()
    assert seen[0][0] == seen[1][0] == 3 and seen[1][1] == 2  # suspended in layer 3 while short computes
    assert res.batches[0].layer == sim.runner.num_layers - 1
