"""mfs+flowprefill: a request the network pruned is deferred by the prefill scheduler instead of computed."""

from __future__ import annotations

from laxflow.integrations.prefill.base import Boundary, PrefillRequest, TtftPredictor
from laxflow.integrations.prefill.registry import create_prefill_scheduler
from laxflow.sim.serving.prefill_driver import PolicyHooks, PrefillDriver


class FakeBatch:
    """Stands in for a BatchRun: records what the driver does to it."""

    def __init__(self, task):
        self.task = task
        self.preempt_requested = False
        self.log: list[str] = []

    def begin(self):
        self.log.append("begin")

    def resume(self):
        self.log.append("resume")


class Pruned:
    def __init__(self):
        self.names: set[str] = set()

    @property
    def pruned_requests(self) -> set[str]:  # a property, as on MfsPolicy
        return set(self.names)


def _driver(pruned):
    clock = [0.0]
    started: list[FakeBatch] = []

    def start(task):
        started.append(FakeBatch(task))
        return started[-1]

    predictor = TtftPredictor([(1, 0.001), (1000, 0.1), (10000, 1.0)])
    sched = create_prefill_scheduler("flowprefill", predictor, 8192)
    drv = PrefillDriver(sched, lambda: clock[0], start, PolicyHooks(pruned).pruned)
    return drv, started, clock


def test_pruned_running_task_is_deferred_and_resumed_when_idle():
    pruned = Pruned()
    drv, started, clock = _driver(pruned)
    a = PrefillRequest("a", 0.0, 2.0, 5000)
    b = PrefillRequest("b", 0.1, 50.0, 300)  # a looser deadline: S-EDF alone would not preempt a for it
    drv.arrival(a)
    assert [t.task.requests for t in started] == [(a,)]
    clock[0] = 0.1
    drv.arrival(b)
    assert not started[0].preempt_requested  # nothing pruned yet: a keeps running
    pruned.names = {"a"}  # the network found a cannot meet its deadline
    clock[0] = 0.2
    drv.arrival(PrefillRequest("c", 0.2, 60.0, 100))
    assert started[0].preempt_requested  # pruned: preempted at the next boundary instead of burning compute
    assert drv.boundary(started[0], int(Boundary.OPERATOR), 0.3)
    assert drv.deferred == [started[0].task]
    # b (and c) start now; a waits although its deadline is the earliest.
    assert all(r.id != "a" for s in started[1:] for r in s.task.requests)
    assert started[1].log == ["begin"]
    clock[0] = 0.5
    drv.compute_done(started[1])
    if len(started) > 2:  # c may have been batched with b or run on its own
        drv.compute_done(started[2])
    # Idle: the deferred task comes back (resumed where it stopped, not recomputed).
    assert started[0].log == ["begin", "resume"]
    assert drv.deferred == [] and drv.deferrals == 1
    drv.compute_done(started[0])
    assert drv.scheduler.idle()


def test_without_pruning_nothing_is_deferred():
    drv, started, clock = _driver(Pruned())
    drv.arrival(PrefillRequest("a", 0.0, 2.0, 5000))
    clock[0] = 0.1
    drv.arrival(PrefillRequest("b", 0.1, 50.0, 300))
    assert not started[0].preempt_requested and drv.deferred == []


def test_network_aware_dispatch_avoids_a_loaded_nic():
    import pytest
    from serving_factories import create_config

    from laxflow.errors import UserError
    from laxflow.policy import Flow, Stage
    from laxflow.sim.events import Priority
    from laxflow.sim.serving.simulator import ServingSimulator
    from laxflow.sim.workload import Request

    config = create_config("llama3-8b", servers=2, gpus_per_server=2, deployment="llama3-8b-tp1-a800",
                           router_dispatch="ttft")
    reqs = [Request(id=f"r{i}", arrival=0.0, input_tokens=4000, output_tokens=1) for i in range(2)]
    sim = ServingSimulator(config, reqs, "fs")
    cost = sim._ttft_cost(4000, 16)
    assert cost(0, 0) == pytest.approx(cost(1, 0))
    # Unit 0's NIC busy: a long transfer out of it for five load windows.
    topo, net = sim.cluster.topology, sim.network
    nic, other = sim.cluster.prefill_units[0].gpus[0], sim.cluster.prefill_units[1].gpus[0]
    assert topo.egress(nic) in topo.path(nic, other).tolist()
    net.add_flow(Flow.on_path("hog", 1e15, topo.path(nic, other), stage=Stage.REUSE))
    net.queue.push(5 * net.load_window, Priority.COMPUTE, net.reschedule)  # (the average is as of the last event)
    net.run(until=5 * net.load_window)
    assert net.link_load[topo.egress(nic)] > 0.9
    cost = sim._ttft_cost(4000, 16)
    assert cost(0, 0) > cost(1, 0)
    sim.router.ttft_cost = cost
    route = sim.router.route([], 16, 4000, [0, 0], [0.0, 0.0])
    assert route.prefill == 1  # the load-only router would take unit 0 (tie, lowest index)
    with pytest.raises(UserError, match="router_dispatch"):
        create_config("llama3-8b", servers=2, router_dispatch="nope")


def test_a_pruned_task_preempted_by_the_scheduler_before_its_boundary_is_deferred_once():
    # Regression: deferral asked (a pruned), then a tight arrival makes the scheduler preempt a too,
    # before a reaches its boundary. a was deferred twice and later resumed twice: recomputed, its
    # requests finished twice (a fig12-conv run ended with "-32 requests unfinished").
    pruned = Pruned()
    drv, started, clock = _driver(pruned)
    a = PrefillRequest("a", 0.0, 5.0, 5000)
    drv.arrival(a)
    drv.arrival(PrefillRequest("b", 0.0, 50.0, 300))
    pruned.names = {"a"}
    clock[0] = 0.1
    drv.arrival(PrefillRequest("c", 0.1, 60.0, 100))  # a pruned: deferral asked
    assert started[0].preempt_requested and drv._deferring is started[0].task
    clock[0] = 0.15
    drv.arrival(PrefillRequest("t", 0.15, 0.4, 50))  # tight: the scheduler preempts a as well
    assert drv.boundary(started[0], int(Boundary.OPERATOR), 0.2)
    assert drv.deferred == [started[0].task] and drv.deferrals == 1
    for _ in range(10):  # finish everything else; a comes back exactly once, where it stopped
        live = [s for s in started if drv.current is s.task]
        if not live:
            break
        clock[0] += 0.5
        drv.compute_done(live[0])
    assert started[0].log == ["begin", "resume"]
    assert sum(1 for s in started if s.task is started[0].task) == 1 and drv.deferred == []
