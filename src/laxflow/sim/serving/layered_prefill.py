"""Prefill units of both serving engines: a prefill scheduler's tasks run as layer-by-layer batches.

One :class:`LayeredPrefill` per prefill unit (the unit engine's
:class:`~laxflow.sim.serving.simulator.ServingSimulator`) or per prefill
instance with a prefill scheduler (the instance engine's
:class:`~laxflow.sim.serving.instances.unit.UnitInstance`): a
:class:`~laxflow.sim.serving.prefill_driver.PrefillDriver` over the unit's
``laxflow.integrations.prefill`` scheduler (``--prefill``; ``fcfs`` by
default), whose every started task becomes a
:class:`~laxflow.sim.serving.batch.BatchRun` of the deployment's layer plan
(:meth:`~laxflow.sim.serving.plan.ModelRunner.plan`: compute segments, the
EP/SP/cross-server TP collectives as flows), with chunked prefill's extra
passes and operator boundaries where the scheduler preempts. Everything runs
on the owning engine's thread, inside its event callbacks.
"""

from __future__ import annotations

from typing import Any, Callable

from laxflow.errors import UserError, user_errors
from laxflow.sim.serving.batch import BatchContext, BatchRun
from laxflow.sim.serving.cluster import Unit
from laxflow.sim.serving.plan import ModelRunner


def ttft_predictor(runner: ModelRunner, context: BatchContext, top_tokens: int) -> Any:
    """The TTFT predictor of a prefill scheduler: a polynomial fitted to the compute model's own profile of
    one unit (FlowPrefill §6.4), up to ``top_tokens`` prompt tokens."""
    from laxflow.integrations.prefill.base import TtftPredictor

    unit0 = context.cluster.prefill_units[0]
    layers = runner.num_layers
    return TtftPredictor.from_function(lambda n: runner.plan(context.cluster, unit0, [n], [n], [0]).compute * layers,
                                       top_tokens)


def check_scheduler(name: str, runner: ModelRunner) -> None:
    """``name`` is a prefill scheduler that can run this deployment's units (a UserError naming ``--prefill``)."""
    from laxflow.integrations.prefill.registry import prefill_scheduler_class

    with user_errors("--prefill"):
        ranked = prefill_scheduler_class(name).rank_batches
    if runner.attn_dp != 1 and not ranked:
        raise UserError(f"--prefill: {name!r} needs one attention group per prefill unit; "
                        f"deployment {runner.deployment.name!r} has attn_dp={runner.attn_dp}")


class LayeredPrefill:
    """One prefill unit: its driver, and its tasks as batches on ``context`` (module docstring)."""

    def __init__(self, context: BatchContext, unit: Unit, name: str, predictor: Any, token_budget: int,
                 pruned: Callable[[], set[str]] | None, later: Callable[[Callable[[], None]], None] | None,
                 batches: list[BatchRun]) -> None:
        from laxflow.integrations.prefill.registry import create_prefill_scheduler
        from laxflow.sim.serving.prefill_driver import PrefillDriver

        self.context = context
        self.unit = unit
        self.batches = batches  # the run's batches (a batch's id is its index there)
        with user_errors("--prefill"):
            sched = create_prefill_scheduler(name, predictor, token_budget)
        self.driver = PrefillDriver(sched, lambda: context.queue.now, self._task_batch, pruned,
                                    context.runner.attn_dp, later)

    def _task_batch(self, task: Any) -> BatchRun:
        """The driver's new task as a preemptible batch (the driver begins it)."""
        from laxflow.integrations.prefill.base import Boundary
        from laxflow.sim.serving.prefill_driver import chunk_pieces, chunked_plan, operator_fractions

        driver, runner, cluster, spec = self.driver, self.context.runner, self.context.cluster, self.unit
        sched = driver.scheduler
        states = list(task.requests)
        new = [max(1, s.new_tokens) for s in states]
        ctx = [s.route.reused_tokens + n for s, n in zip(states, new)]
        plan = runner.plan(cluster, spec, new, ctx, [s.rank for s in states])
        marks: tuple[float, ...] = ()
        if sched.chunk_tokens and sum(new) > sched.chunk_tokens:
            from laxflow.sim.models import weight_bytes_per_gpu

            dep = runner.deployment
            hbm = float(dep.gpu.mem_bw) * float(dep.gpu.mbu)
            weights = weight_bytes_per_gpu(runner.model, dep) / runner.num_layers
            kv_token = runner.kv_transfer_bytes_per_token_per_layer / runner.tp
            chunks = []
            for c, piece in enumerate(chunk_pieces(list(zip(new, ctx)), int(sched.chunk_tokens))):
                t = runner.plan(cluster, spec, [n for n, _ in piece], [x for _, x in piece], [0] * len(piece)).compute
                if c > 0:
                    # Each extra pass streams the layer's weights again and re-reads the prior chunks' KV
                    # (FlowPrefill §3.1's causes); the roofline hides both under the GEMMs, a chunk boundary
                    # does not (a new kernel sequence starts), so they are added, not overlapped.
                    t += (weights + sum(x - n for n, x in piece) * kv_token) / hbm
                chunks.append(t)
            plan, marks = chunked_plan(plan, plan.compute, chunks)
        batch = BatchRun(self.context, len(self.batches), spec, states, plan)
        self.batches.append(batch)
        if sched.granularity != Boundary.NEVER:
            batch.check = lambda kind, progress: driver.boundary(batch, kind, progress)
            if sched.granularity in (Boundary.OPERATOR, Boundary.CHUNK):
                batch.op_fractions = operator_fractions(runner.model, new, ctx)
            batch.chunk_marks = marks
        return batch
