"""Prefill policies on small hand-checked queues, and a toy executor driving the base.py protocol."""

from __future__ import annotations

import pytest

from laxflow.integrations.prefill import (
    Boundary,
    PrefillRequest,
    Preempt,
    Resume,
    Submit,
    Task,
    TtftPredictor,
    create_prefill_scheduler,
    prefill_scheduler_names,
    yields_at,
)
from laxflow.integrations.prefill.flowprefill import FlowPrefill

LINEAR = TtftPredictor([(1000, 1.0), (2000, 2.0), (3000, 3.0)], degree=1)  # 1 ms per token


def req(rid: str, deadline: float, tokens: int, arrival: float = 0.0) -> PrefillRequest:
    return PrefillRequest(rid, arrival, deadline, tokens)


def test_predictor_fits_polynomial_profile():
    quad = TtftPredictor.from_function(lambda n: 0.01 + 1e-4 * n + 1e-8 * n * n, 8192)
    assert quad(4096) == pytest.approx(0.01 + 0.4096 + 1e-8 * 4096**2, rel=1e-6)
    assert LINEAR(1500) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="at least 3"):
        TtftPredictor([(1, 1.0), (2, 2.0)])
    with pytest.raises(ValueError, match="tokens > 0"):
        TtftPredictor([(0, 1.0), (2, 2.0), (3, 3.0)])


def test_registry_names_and_unknown():
    assert prefill_scheduler_names() == ["edf-cp2k", "edf-cp8k", "edf-layer", "fcfs", "flowprefill"]
    with pytest.raises(ValueError, match="unknown prefill scheduler 'nope'.*flowprefill"):
        create_prefill_scheduler("nope", LINEAR)


def test_sedf_order_positive_slack_by_deadline_then_negative_by_latest_deadline():
    s = FlowPrefill(LINEAR)
    a, b, c, d = req("a", 10, 1000), req("b", 5, 1000), req("c", 2, 3000), req("d", 3, 4000)
    s.waiting = [a, b, c, d]
    # slack: a 9, b 4, c -1, d -1 -> b, a (earliest deadline first), then d, c (sgn(-1)/deadline)
    assert [r.id for r, _ in s.ranked(0.0)] == ["b", "a", "d", "c"]
    # later, b's slack turns negative (5 - 4.5 - 1 < 0): a leads
    assert [r.id for r, _ in s.ranked(4.5)][0] == "a"


def test_algorithm1_token_budget_is_strict_and_candidates_in_order():
    s = FlowPrefill(LINEAR, token_budget=4000)
    h = req("h", 5, 1000)
    x1, x2, x3, x4 = req("x1", 50, 1000), req("x2", 50, 2500), req("x3", 50, 1500), req("x4", 50, 500)
    # n: 2000 in; 4500 >= G out; 3500 in; 4000 not < G out
    assert [r.id for r in s.batch(h, [x1, x2, x3, x4], 0.0)] == ["h", "x1", "x3"]


def test_algorithm1_head_deadline_bounds_batch_latency():
    s = FlowPrefill(LINEAR, token_budget=100_000)
    h = req("h", 2.5, 1000)
    x1, x3, x4 = req("x1", 50, 1000), req("x3", 50, 1500), req("x4", 50, 500)
    # T_remain 2.5: 2000 tok = 2 s in; 3500 = 3.5 s out; 2500 = 2.5 s not < 2.5 out
    assert [r.id for r in s.batch(h, [x1, x3, x4], 0.0)] == ["h", "x1"]


def test_algorithm2_figure8_submit_preempt_resume():
    s = create_prefill_scheduler("flowprefill", LINEAR)
    a, b = req("A", 100, 5000), req("B", 2, 500, arrival=1.0)
    (sub_a,) = s.arrival(a, 0.0)
    assert isinstance(sub_a, Submit) and sub_a.task.requests == (a,)
    pre, sub_b = s.arrival(b, 1.0)
    assert pre == Preempt(sub_a.task) and isinstance(sub_b, Submit) and sub_b.task.requests == (b,)
    s.preempted(sub_a.task, Boundary.OPERATOR, 0.2, 1.001)
    assert s.completion(sub_b.task, 1.6) == [Resume(sub_a.task)]
    assert s.completion(sub_a.task, 5.0) == []
    assert s.idle()


def test_flowprefill_new_batch_takes_waiting_not_running():
    s = create_prefill_scheduler("flowprefill", LINEAR, token_budget=4000)
    (run,) = s.arrival(req("long", 100, 6000), 0.0)
    # a later arrival with a looser deadline never preempts
    assert s.arrival(req("loose", 200, 100, arrival=0.1), 0.1) == []
    # a tight one preempts and batches with the loose waiting one (2100 tokens < G, 2.1 s < 9.8 s)
    pre, sub = s.arrival(req("tight", 10, 2000, arrival=0.2), 0.2)
    assert pre.task is run.task and [r.id for r in sub.task.requests] == ["tight", "loose"]
    assert s.waiting == []


def test_sedf_does_not_preempt_for_a_request_that_cannot_make_it():
    s = create_prefill_scheduler("flowprefill", LINEAR)
    s.arrival(req("A", 100, 5000), 0.0)
    # deadline 3 < A's 100, but 4000 tokens need 4 s: negative slack, A keeps running
    assert s.arrival(req("C", 3, 4000, arrival=0.5), 0.5) == []
    # EDF (no slack) would switch
    e = create_prefill_scheduler("edf-layer", LINEAR)
    e.arrival(req("A", 100, 5000), 0.0)
    assert [type(a) for a in e.arrival(req("C", 3, 4000, arrival=0.5), 0.5)] == [Preempt, Submit]


def test_fcfs_never_preempts_and_batches_in_arrival_order():
    s = create_prefill_scheduler("fcfs", LINEAR, token_budget=3000)
    (first,) = s.arrival(req("a", 100, 5000), 0.0)  # larger than G: alone
    assert s.arrival(req("b", 1, 1000), 0.1) == [] and s.arrival(req("c", 1, 1500), 0.2) == []
    assert s.arrival(req("d", 1, 1000), 0.3) == []
    (nxt,) = s.completion(first.task, 5.0)
    assert [r.id for r in nxt.task.requests] == ["b", "c"]


def test_yields_at_orders_boundaries():
    assert yields_at(Boundary.OPERATOR, Boundary.OPERATOR)
    assert not yields_at(Boundary.OPERATOR, Boundary.LAYER) and yields_at(Boundary.LAYER, Boundary.LAYER)
    assert yields_at(Boundary.CHUNK, Boundary.LAYER)
    assert not yields_at(Boundary.LAYER, Boundary.CHUNK) and yields_at(Boundary.CHUNK, Boundary.CHUNK)
    assert not any(yields_at(k, Boundary.NEVER) for k in Boundary)


class ToyExecutor:
    """Runs tasks as a list of boundaries (chunks x layers x 5 operators), one per step, per base.py."""

    def __init__(self, scheduler, layers: int = 2):
        self.s, self.layers = scheduler, layers
        self.now = 0.0
        self.pos: dict[int, int] = {}  # task id -> steps done
        self.plan: dict[int, list[Boundary]] = {}
        self.current: Task | None = None
        self.signal = False
        self.pending: list = []  # Submit/Resume waiting for the running task to yield
        self.log: list[tuple[str, str, Boundary, int]] = []  # (event, task head, boundary, step)

    def boundaries(self, task: Task) -> list[Boundary]:
        chunk = self.s.chunk_tokens or task.tokens
        chunks = -(-task.tokens // chunk)
        out = []
        for c in range(chunks):
            for layer in range(self.layers):
                for op in range(5):
                    last_op = op == 4
                    kind = Boundary.OPERATOR
                    if last_op:
                        end_chunk = self.s.chunk_tokens is not None and layer == self.layers - 1
                        kind = Boundary.CHUNK if end_chunk else Boundary.LAYER
                    out.append(kind)
        return out

    def apply(self, actions):
        for a in actions:
            if isinstance(a, Preempt):
                if a.task is self.current:
                    self.signal = True
                else:  # submitted but never started: stays suspended
                    self.pending = [p for p in self.pending if p.task is not a.task]
            else:
                self.plan.setdefault(a.task.id, self.boundaries(a.task))
                self.pos.setdefault(a.task.id, 0)
                self.pending.append(a)
        self._start()

    def _start(self):
        if self.current is None and self.pending:
            self.current = self.pending.pop(0).task

    def step(self):
        t = self.current
        self.now += 0.001
        self.pos[t.id] += 1
        plan = self.plan[t.id]
        if self.pos[t.id] == len(plan):
            self.current, self.signal = None, False
            self.log.append(("done", t.head.id, Boundary.CHUNK, self.pos[t.id]))
            self.apply(self.s.completion(t, self.now))
            return
        kind = plan[self.pos[t.id] - 1]
        if self.signal and yields_at(kind, self.s.granularity):
            self.current, self.signal = None, False
            self.log.append(("yield", t.head.id, kind, self.pos[t.id]))
            self.s.preempted(t, kind, self.pos[t.id] / len(plan), self.now)
            self._start()

    def run(self, arrivals: dict[int, PrefillRequest], steps: int = 10_000):
        for i in range(steps):
            if i in arrivals:
                self.apply(self.s.arrival(arrivals[i], self.now))
            if self.current is None and i > max(arrivals):
                break
            if self.current is not None:
                self.step()


@pytest.mark.parametrize(
    "name,kind,step",
    [
        ("flowprefill", Boundary.OPERATOR, 8),  # signal raised after step 7: yields after the next operator
        ("edf-layer", Boundary.LAYER, 10),  # end of layer 2 (5 ops per layer)
        ("edf-cp2k", Boundary.CHUNK, 15),  # end of the first chunk: 3 layers per chunk
        ("edf-cp8k", Boundary.CHUNK, 15),
    ],
)
def test_switch_only_at_own_boundary(name, kind, step):
    s = create_prefill_scheduler(name, LINEAR, token_budget=8192)
    ex = ToyExecutor(s, layers=3)
    long = req("long", 1000, 12000)  # 6 chunks of 2k, 2 of 8k
    short = req("short", 0.5, 100, arrival=0.007)
    ex.run({0: long, 7: short})
    yields = [e for e in ex.log if e[0] == "yield"]
    assert yields == [("yield", "long", kind, step)]
    assert [e[1] for e in ex.log if e[0] == "done"] == ["short", "long"]
    assert s.idle() and s.preemptions[0][1] == kind


def test_fcfs_runs_to_completion_in_toy_executor():
    s = create_prefill_scheduler("fcfs", LINEAR)
    ex = ToyExecutor(s)
    ex.run({0: req("long", 1000, 6000), 3: req("short", 0.5, 100)})
    assert [e[:2] for e in ex.log] == [("done", "long"), ("done", "short")]
    assert s.idle()


def test_preempt_of_task_not_started_keeps_it_suspended():
    s = create_prefill_scheduler("flowprefill", LINEAR)
    ex = ToyExecutor(s, layers=1)
    # b preempts a; before a yields, c preempts b (not started): b must run after c, then a
    ex.run({0: req("a", 1000, 6000), 2: req("b", 5, 100), 3: req("c", 1, 100)})
    assert [e[1] for e in ex.log if e[0] == "done"] == ["c", "b", "a"]
    assert s.idle()
