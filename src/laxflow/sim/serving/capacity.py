"""Capacity of a model on a workload: the per-GPU rate the figure presets are fractions of.

Called by ``bench/capacity.py`` (which prints the table ``CAPACITY`` in
:mod:`.experiment` is copied from) and by tests; pure (a one-unit batching
loop, no network simulation), any thread, about half a second per pair.

Method (README "laxflow sim serve", presets), the same for every pair: take
``requests`` requests of the workload at ``seed`` (its own arrival process,
rescaled to the rate) and feed them to one prefill unit alone: the
simulator's own prefill scheduler, ``fcfs`` (the same batching code, not a
copy of it), with the rank rule of the simulator's
:class:`~.prefill_driver.PrefillDriver`: each attention-DP rank has its own
queue (a request joins the rank with the fewest new tokens waiting or
running) and takes first come, first served up to ``token_budget`` new
tokens; one step runs every rank's batch together and
lasts ``num_layers`` x (the layer's compute + its blocking collectives alone
on an idle fabric, ``LayerPlan.idle_cct``). The capacity is the per-GPU rate
(bisected) at which that unit is busy ``BUSY`` (99 %) of the time between the
arrival of the first 10 % and the last arrival. Every prompt is computed in
full: realized reuse depends on load, run length and policy (it falls from
0.47 to 0.13 of input tokens as Mixtral goes from 0.41 to 0.82 req/s/GPU),
so crediting the workload's reuse (``credit_reuse=True``) would put the
presets' upper fractions beyond saturation.

Why not the old method (one full 8192-token batch back to back): with
per-rank batching a step lasts as long as its slowest rank, and near
saturation the ranks' batches are neither full nor balanced, so full
balanced batches (``full_batch_rate``, still reported) overstate what a unit
sustains: 0.92 vs 0.81 for Mixtral-8x22B (8 ranks), 0.73 vs 0.27 for
Qwen3-Coder (32 ranks) on QwenA conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from laxflow.integrations.prefill.base import Task
from laxflow.integrations.prefill.fcfs import Fcfs
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.plan import ModelRunner
from laxflow.sim.serving.prefill_driver import PrefillDriver
from laxflow.sim.serving.request_state import RequestState
from laxflow.sim.serving.router import Route
from laxflow.sim.serving.slo import workload_reuse
from laxflow.sim.workload.request import Request


# Every (model, workload) pair of ``experiment.CAPACITY`` and the cluster it is computed on: 32
# fat-tree servers, except the testbed's model, which only runs on the testbed (8 servers, its
# deployment and topology).
TESTBED = {"deployment": "testbed-mixtral-8x7b", "servers": 8, "topology": "testbed"}
PAIRS: dict[tuple[str, str], dict] = {
    **{(m, w): {} for w in ("qwen-conv", "qwen-agent") for m in ("mixtral-8x22b", "dbrx", "qwen3-coder", "grok-2")},
    ("llama3-8b", "mooncake-conv"): {}, ("llama3-8b", "mooncake-agent"): {},
    ("mixtral-8x7b", "qwen-conv"): TESTBED, ("mixtral-8x7b", "qwen-agent"): TESTBED,
}
BUSY = 0.99  # "always busy": the unit's busy share over the measured arrivals
BISECTIONS = 14  # bisection steps on the rate (ceiling / 2**14: far below the table's 3 digits)


@dataclass(frozen=True)
class Capacity:
    """One model on one workload (what ``bench/capacity.py`` prints per pair)."""

    model: str
    workload: str
    per_gpu_rate: float  # requests/s per prefill GPU at which a unit alone is busy BUSY of the time
    full_batch_rate: float  # the same with every step full and balanced (the old method's number)
    unit_gpus: int
    ranks: int
    full_steps: int
    step_seconds: float  # mean duration of a full step
    step_tokens: float  # mean new tokens of a full step
    mean_new_tokens: float  # per request, input minus workload reuse


class _Unit:
    """One prefill unit as the simulator runs it by default: a :class:`.prefill_driver.PrefillDriver`
    over ``fcfs`` (rank choice, per-rank FCFS budget, one task over every rank, load released when the
    task's compute ends), executed here by hand: a task that starts is returned by :meth:`arrive` or
    :meth:`done` and runs until the caller says it is done. State ``i`` computes ``new_tokens[i]``
    tokens (no reuse on its route); ``index`` = i."""

    def __init__(self, new_tokens: Sequence[int], ranks: int, budget: int) -> None:
        self.started: Task | None = None
        self._deliver: list = []  # the driver's call for this instant's arrivals
        fcfs = Fcfs(None, budget)  # (FCFS reads no TTFT predictor)
        self.driver = PrefillDriver(fcfs, lambda: 0.0, self._start, ranks=ranks, later=self._deliver.append)
        self.states = [RequestState(Request(id=str(i), arrival=0.0, input_tokens=int(n), output_tokens=1), i,
                                    Route(0, 0, 0, 0, None), 0.0, 0.0) for i, n in enumerate(new_tokens)]

    def _start(self, task: Task) -> "_Run":
        self.started = task
        return _Run()

    def waiting_ranks(self) -> set[int]:
        return {s.rank for s in self.driver.scheduler.waiting}

    def arrive(self, indices: Sequence[int]) -> Task | None:
        """States ``indices`` arrive together (each on its rank); the task that starts now, if one does."""
        self.started = None
        for i in indices:
            self.driver.arrival(self.states[i])
        if self._deliver:
            self._deliver.pop()()
        return self.started

    def done(self, task: Task) -> Task | None:
        """``task``'s compute ended; the task that starts now, if one does."""
        self.started = None
        self.driver.compute_done(self.driver.runs[task.id])
        return self.started


class _Run:
    """What the driver begins for a task (the caller times it)."""

    def begin(self) -> None:
        pass


def _by_rank(chosen: Sequence[RequestState], ranks: int) -> list[list[int]]:
    step: list[list[int]] = [[] for _ in range(ranks)]
    for s in chosen:
        step[s.rank].append(s.index)
    return step


def full_steps(new_tokens: Sequence[int], ranks: int, budget: int) -> list[list[list[int]]]:
    """The unit's full steps over these requests, all queued at once (see module docstring).

    Returns per step, per rank, the indices of the requests in that rank's batch. A step is full when
    every rank still has requests waiting after it; the walk stops at the first step that is not.
    """
    unit = _Unit(new_tokens, ranks, budget)
    task = unit.arrive(range(len(new_tokens)))
    steps: list[list[list[int]]] = []
    while task is not None and len(unit.waiting_ranks()) == ranks:  # every rank still waits after it: full
        steps.append(_by_rank(task.requests, ranks))
        task = unit.done(task)
    return steps


def capacity(model: str, workload: str, *, deployment: str | None = None, servers: int = 32, requests: int = 1000,
             seed: int = 0, token_budget: int = 8192, topology: str = "fat-tree", busy: float = BUSY,
             credit_reuse: bool | None = None, reqs: Sequence | None = None, physics: str = "faithful") -> Capacity:
    """Capacity of ``model`` on ``workload`` (``reqs`` given: those requests instead of generating them).

    ``physics``: ``config.parse_physics``'s spec; its MoE exchange and compute share shape every step,
    and ``credit_reuse`` left at None credits the workload's reuse exactly when that physics realizes it
    (``reuse_from="routed"``: reuse no longer depends on load, so the unit computes only the new tokens).
    """
    from laxflow.errors import UserError
    from laxflow.sim import workload as wl
    from laxflow.sim.serving.config import parse_physics

    phys = parse_physics(physics)
    if credit_reuse is None:
        credit_reuse = phys["reuse_from"] == "routed"
    runner = ModelRunner(model, deployment, phys["ep_comm"], phys["comm_share"])
    dep = runner.deployment
    config = ClusterConfig(servers=servers, topology=topology, fairness=phys["fairness"]).resolve(
        int(dep.gpus_per_node), float(dep.nic_gbps), float(dep.intra_node_gbps or 7200.0))
    cluster = Cluster(config, runner.unit_gpus)
    unit = cluster.prefill_units[0]
    if reqs is None:
        reqs = wl.generate(workload, 1.0, requests, seed)
    reqs = sorted(reqs, key=lambda r: r.arrival)
    reuse = workload_reuse(reqs) if credit_reuse else [0] * len(reqs)
    new = [max(1, int(r.input_tokens) - u) for r, u in zip(reqs, reuse)]
    ctx = [int(r.input_tokens) for r in reqs]
    nvswitch = float(config.nvswitch_bytes_per_s)

    def step_seconds(idx: list[int], ranks: list[int]) -> float:
        plan = runner.plan(cluster, unit, [new[i] for i in idx], [ctx[i] for i in idx], ranks)
        return runner.num_layers * (plan.compute + plan.idle_cct(nvswitch))

    steps = full_steps(new, runner.attn_dp, token_budget)
    if not steps:
        raise UserError(f"capacity: {len(reqs)} requests of {workload!r} fill no full step of {runner.attn_dp} "
                        f"rank(s) x {token_budget} tokens; use more requests")
    seconds = tokens = 0.0
    for step in steps:
        idx = [i for batch in step for i in batch]
        seconds += step_seconds(idx, [r for r, batch in enumerate(step) for _ in batch])
        tokens += sum(new[i] for i in idx)
    mean_new = sum(new) / len(new)
    gpus = runner.unit_gpus
    ceiling = tokens / seconds / mean_new / gpus
    # The workload's arrivals at 1 request/s, rescaled: generate() keeps shapes and order at any rate.
    base = [float(r.arrival) for r in reqs]
    span = base[-1] / (len(base) - 1) if len(base) > 1 else 1.0

    def util(rate: float) -> float:  # rate per GPU -> requests/s at this unit = rate * gpus
        scale = 1.0 / (rate * gpus * span)
        return busy_fraction([a * scale for a in base], new, runner.attn_dp, token_budget, step_seconds)

    lo, hi = 0.0, ceiling  # util(ceiling) >= busy: the unit cannot beat full balanced batches
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if util(mid) >= busy:
            hi = mid
        else:
            lo = mid
    return Capacity(model, workload, hi, ceiling, gpus, runner.attn_dp, len(steps), seconds / len(steps),
                    tokens / len(steps), mean_new)


# -- the unit alone under Poisson arrivals (the method with per-rank batching) --------------------


def busy_fraction(arrivals: Sequence[float], new_tokens: Sequence[int], ranks: int, budget: int,
                  step_seconds: Callable[[list[int], list[int]], float], warmup: float = 0.1) -> float:
    """Share of time one unit is busy between the arrival of request ``warmup x n`` and the last arrival.

    Batches with the simulator's own driver and FCFS (see :class:`_Unit`); a
    step starts when the unit is idle and a request waits, and lasts ``step_seconds(requests, their
    ranks)``; requests arriving during a step see its requests still on their ranks, as in the simulator.
    """
    n = len(arrivals)
    unit = _Unit(new_tokens, ranks, budget)
    t0, t1 = arrivals[min(n - 1, int(warmup * n))], arrivals[-1]
    busy = 0.0
    now, i = 0.0, 0
    task: Task | None = None

    def admit(until: float) -> None:
        nonlocal i, task
        first = i
        while i < n and arrivals[i] <= until:
            i += 1
        task = unit.arrive(range(first, i)) or task

    while i < n or task is not None:
        admit(now)
        if task is None:
            now = arrivals[i]
            continue
        end = now + step_seconds([s.index for s in task.requests], [s.rank for s in task.requests])
        busy += max(0.0, min(end, t1) - max(now, t0))
        admit(end)
        task = unit.done(task)
        now = end
    return busy / (t1 - t0) if t1 > t0 else 1.0
