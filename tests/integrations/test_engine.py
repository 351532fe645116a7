"""The preemptible CPU engine: bitwise resume, preemption at the next operator boundary, hooks."""

from __future__ import annotations

import queue
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="the engine needs the torch extra: pip install 'laxflow[torch]'")

from laxflow.integrations.engine import ExecutionPool, LlamaModel, ModelConfig, PrefillEngine  # noqa: E402
from laxflow.integrations.prefill import (  # noqa: E402
    Boundary,
    PrefillRequest,
    Task,
    TtftPredictor,
    create_prefill_scheduler,
)

CONFIG = ModelConfig(vocab=512, hidden=128, layers=4, heads=8, kv_heads=4, ffn=352, seed=7)
PRED = TtftPredictor([(1, 0.001), (256, 0.01), (1024, 0.05)])


@pytest.fixture(scope="module")
def model():
    return LlamaModel(CONFIG)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, CONFIG.vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class GateHooks:
    """Records every hook call by request; blocks the worker when ``gate_request``'s batch begins ``gate_layer``."""

    def __init__(self, gate_request: str | None = None, gate_layer: int = 1):
        self.calls: list[tuple[str, str, int]] = []
        self.members: dict[str, list[str]] = {}
        self.gate_request, self.gate_layer = gate_request, gate_layer
        self.reached, self.go = threading.Event(), threading.Event()

    def batch_formed(self, batch, requests):
        self.members[batch] = list(requests)

    def layer_begin(self, batch, layer):
        self.calls += [("begin", r, layer) for r in self.members[batch]]
        if self.gate_request in self.members[batch] and layer == self.gate_layer and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(30)

    def layer_end(self, batch, layer, last=False):
        self.calls += [("end", r, layer) for r in self.members[batch]]
        assert last == (layer == CONFIG.layers - 1)


def wait_for(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.001)


def preempt_long_by_short(model, policy: str, granularity=None):
    """A long loose prefill held at layer 1's start until a tight arrival raised its signal."""
    hooks = GateHooks(gate_request="long")
    engine = PrefillEngine(model, create_prefill_scheduler(policy, PRED), hooks=hooks, granularity=granularity)
    long_ids, short_ids = tokens(300, 1), tokens(20, 2)
    with engine:
        engine.add_request(long_ids, slo=100.0, request_id="long")
        assert hooks.reached.wait(30)
        engine.add_request(short_ids, slo=5.0, request_id="short")
        wait_for(engine.pool._flag.is_set)
        hooks.go.set()
        long_logits, short_logits = engine.result("long", 60), engine.result("short", 60)
    assert not engine.errors
    assert torch.equal(long_logits, model.forward([long_ids])[0])
    assert torch.equal(short_logits, model.forward([short_ids])[0])
    return engine, hooks


def test_high_priority_arrival_preempts_at_next_operator_boundary(model):
    engine, hooks = preempt_long_by_short(model, "flowprefill")
    (yield_,) = engine.pool.yields
    # signal raised before layer 1's qkv_proj: suspended right after it, before attn
    assert yield_[1:] == (Boundary.OPERATOR, 1, 1, 6)
    assert [t.head.id for t, _ in engine.completed_tasks] == ["short", "long"]
    assert [k for _, k in engine.scheduler.preemptions] == [Boundary.OPERATOR]
    assert engine.scheduler.idle()
    # the short request ran entirely while long was suspended in layer 1
    i = hooks.calls.index(("begin", "short", 0))
    assert hooks.calls[i - 1] == ("begin", "long", 1) and hooks.calls[i + 7] == ("end", "short", 3)


def test_layer_checks_suspend_only_at_layer_end(model):
    engine, _ = preempt_long_by_short(model, "edf-layer")
    (yield_,) = engine.pool.yields
    assert yield_[1:] == (Boundary.LAYER, 2, 0, 10)


class StopAt:
    """The model, plus: ask ``pool`` to preempt ``task`` right after operator number ``stop_at``."""

    def __init__(self, model, stop_at):
        self.model, self.stop_at = model, stop_at
        self.pool = self.task = None
        self.start, self.total_ops, self.config = model.start, model.total_ops, model.config

    def run_op(self, s):
        self.model.run_op(s)
        if s.ops_done == self.stop_at:
            self.pool.preempt(self.task)


def test_resume_is_bitwise_equal_at_every_operator(model):
    ids = [tokens(50, 3), tokens(17, 4)]
    reference = model.forward(ids)
    for stop_at in range(1, model.total_ops):
        events = queue.Queue()
        wrapped = StopAt(model, stop_at)
        pool = ExecutionPool(wrapped, on_event=lambda kind, t, payload: events.put((kind, payload)))
        wrapped.pool = pool
        wrapped.task = task = Task((PrefillRequest("a", 0, 1, 50, ids[0]), PrefillRequest("b", 0, 1, 17, ids[1])))
        worker = threading.Thread(target=pool.run, daemon=True)
        worker.start()
        pool.submit(task)
        kind, (boundary, progress) = events.get(timeout=30)
        expected = Boundary.LAYER if stop_at % 5 == 0 else Boundary.OPERATOR  # 5 operators per layer
        assert kind == "preempted" and boundary == expected and progress == stop_at / model.total_ops
        wrapped.stop_at = None
        pool.resume(task)
        kind, logits = events.get(timeout=30)
        pool.close()
        worker.join(30)
        assert kind == "completed" and pool.yields[0][4] == stop_at
        assert torch.equal(logits, reference)


def test_hooks_see_every_layer_and_hook_errors_do_not_stop_prefill(model):
    class Broken:
        def __init__(self):
            self.seen = []

        def layer_begin(self, batch, layer):
            self.seen.append(("b", batch, layer))
            raise RuntimeError("hook down")

        def layer_end(self, batch, layer, last=False):
            self.seen.append(("e", batch, layer, last))

    hooks = Broken()
    engine = PrefillEngine(model, create_prefill_scheduler("flowprefill", PRED), hooks=hooks)
    with engine:
        engine.add_request(tokens(30, 5), slo=10.0, request_id="x")
        engine.result("x", 60)
    (task, _), = engine.completed_tasks
    batch = f"prefill-{task.id}"
    assert hooks.seen == [e for layer in range(4) for e in (("b", batch, layer), ("e", batch, layer, layer == 3))]
    assert engine.pool.hook_errors == 4


def test_model_config_and_input_errors(model):
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        ModelConfig(heads=8, kv_heads=3)
    with pytest.raises(ValueError, match="token ids must lie"):
        model.start([[0, CONFIG.vocab]])
    with pytest.raises(ValueError, match="operator or layer"):
        ExecutionPool(model, granularity=Boundary.CHUNK)


def test_preempt_of_a_queued_task_keeps_it_until_resumed(model):
    events = queue.Queue()
    pool = ExecutionPool(model, on_event=lambda kind, t, payload: events.put((kind, t, payload)))
    a = Task((PrefillRequest("a", 0, 1, 9, tokens(9, 8)),))
    b = Task((PrefillRequest("b", 0, 1, 11, tokens(11, 9)),))
    pool.submit(a)
    pool.submit(b)
    pool.preempt(b)  # not started: dropped from the queue, kept as suspended
    with pytest.raises(ValueError, match="neither suspended nor running"):
        pool.resume(Task((PrefillRequest("c", 0, 1, 1, [1]),)))
    worker = threading.Thread(target=pool.run, daemon=True)
    worker.start()
    kind, task, logits = events.get(timeout=30)
    assert (kind, task) == ("completed", a)
    pool.resume(b)
    kind, task, logits = events.get(timeout=30)
    pool.close()
    worker.join(30)
    assert (kind, task) == ("completed", b) and pool.yields == []
    assert torch.equal(logits, model.forward([b.requests[0].payload]))


def test_layer_hooks_reach_a_daemon_core_through_laxflow_hooks(model):
    from laxflow.daemon.core import CoreConfig, DaemonCore
    from laxflow.daemon.ports import PortSpec
    from laxflow.daemon.inprocess import InProcessHooks

    class RecordingCore(DaemonCore):
        def __init__(self, config):
            super().__init__(config)
            self.seen = []

        def batch_formed(self, batch, requests, now, compute=0.0, traffic=None):
            self.seen.append(("formed", batch, tuple(requests)))
            super().batch_formed(batch, requests, now, compute, traffic)

        def layer_begin(self, batch, layer, now):
            self.seen.append(("layer", batch, layer))
            super().layer_begin(batch, layer, now)

        def compute_done(self, batch, now):
            self.seen.append(("done", batch))
            super().compute_done(batch, now)

    core = RecordingCore(CoreConfig(ports=(PortSpec("eth0", 12.5e9),), window_bytes=0.0))
    hooks = InProcessHooks(core, time.monotonic)
    engine = PrefillEngine(model, create_prefill_scheduler("flowprefill", PRED), hooks=hooks)
    with engine:
        engine.add_request(tokens(40, 6), slo=10.0, request_id="x")
        engine.result("x", 60)
    (task, _), = engine.completed_tasks
    batch = f"prefill-{task.id}"
    assert core.seen[0][:2] == ("formed", batch)
    assert core.seen[1:] == [("layer", batch, j) for j in range(CONFIG.layers)] + [("done", batch)]
    assert engine.pool.hook_errors == 0
