"""``PrefillScheduler.defer``: started tasks the network pruned give their compute to others (pure, by hand)."""

from __future__ import annotations

from laxflow.integrations.prefill import PrefillRequest, Preempt, Resume, Submit, TtftPredictor, create_prefill_scheduler
from laxflow.integrations.prefill.base import Boundary

LINEAR = TtftPredictor([(1000, 1.0), (2000, 2.0), (3000, 3.0)], degree=1)  # 1 ms per token


def req(rid: str, deadline: float, tokens: int, arrival: float = 0.0) -> PrefillRequest:
    return PrefillRequest(rid, arrival, deadline, tokens)


def test_running_pruned_task_is_preempted_for_waiting_work_and_resumed_when_idle():
    s = create_prefill_scheduler("flowprefill", LINEAR)
    (sub_a,) = s.arrival(req("A", 10, 5000), 0.0)
    assert s.arrival(req("B", 60, 500, arrival=0.5), 0.5) == []  # S-EDF alone keeps A (earlier deadline)
    pre, sub_b = s.defer({"A"}, 0.6)
    assert pre == Preempt(sub_a.task) and isinstance(sub_b, Submit) and sub_b.task.head.id == "B"
    assert s.deferred == [sub_a.task] and s.deferrals == 1 and s.running is sub_b.task
    s.preempted(sub_a.task, Boundary.OPERATOR, 0.1, 0.601)
    assert s.defer({"A"}, 0.7) == []  # already deferred: nothing new
    assert s.completion(sub_b.task, 1.1) == [Resume(sub_a.task)]  # idle: the deferred task comes back
    assert s.deferred == [] and s.completion(sub_a.task, 5.6) == [] and s.idle()


def test_a_lone_pruned_task_keeps_the_compute_and_unpruned_batches_stay():
    s = create_prefill_scheduler("flowprefill", LINEAR)
    (sub_a,) = s.arrival(req("A", 10, 5000), 0.0)
    assert s.defer({"A"}, 0.1) == [] and s.deferred == []  # nothing else to run: work-conserving
    s.arrival(req("B", 60, 500, arrival=0.2), 0.2)
    assert s.defer({"C"}, 0.3) == [] and s.running is sub_a.task  # A not pruned
    assert s.defer(set(), 0.3) == []


def test_suspended_pruned_task_leaves_q_p_and_a_deferred_task_may_complete_before_yielding():
    s = create_prefill_scheduler("flowprefill", LINEAR)
    (sub_a,) = s.arrival(req("A", 100, 5000), 0.0)
    pre, sub_b = s.arrival(req("B", 2, 500, arrival=1.0), 1.0)  # tight: preempts A
    s.preempted(sub_a.task, Boundary.OPERATOR, 0.2, 1.001)
    assert s.defer({"A"}, 1.1) == [] and s.suspended == [] and s.deferred == [sub_a.task]
    assert s.completion(sub_b.task, 1.5) == [Resume(sub_a.task)]
    # A deferred while running finishes before reaching a boundary: its completion is still accepted.
    s2 = create_prefill_scheduler("edf-layer", LINEAR)
    (run,) = s2.arrival(req("X", 10, 3000), 0.0)
    s2.arrival(req("Y", 60, 100, arrival=0.1), 0.1)
    pre, sub = s2.defer({"X"}, 0.2)
    assert pre == Preempt(run.task)
    assert s2.completion(run.task, 0.25) == [] and s2.deferred == []


def test_fcfs_never_preempts_a_pruned_running_task():
    s = create_prefill_scheduler("fcfs", LINEAR)
    (run,) = s.arrival(req("A", 10, 5000), 0.0)
    s.arrival(req("B", 60, 500, arrival=0.5), 0.5)
    assert s.defer({"A"}, 0.6) == [] and s.running is run.task
