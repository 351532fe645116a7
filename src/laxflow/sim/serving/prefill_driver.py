"""A prefill unit driven by a pure ``laxflow.integrations.prefill`` scheduler (``--prefill NAME``).

Created by the simulator, one per prefill unit, over ``ServingConfig.prefill``'s
scheduler, or ``fcfs`` when none is named (run-to-end batches, one per
attention-DP rank: the unit's default). Runs on the simulator's thread, inside
event callbacks; it owns no clock: ``now`` is the event queue's. It puts each
arrival on its unit's least loaded attention-DP rank and tells the scheduler
after every arrival of that instant (``later``), and otherwise follows the
driving protocol of ``laxflow.integrations.prefill.base`` exactly:

* ``arrival`` / ``completion`` events go to the scheduler; its actions are
  applied in order. ``Preempt`` raises the running batch's signal; the batch
  asks :meth:`PrefillDriver.boundary` at each boundary it passes (operator
  ends inside a layer, layer ends, chunk ends), and suspends where
  ``yields_at(kind, granularity)``; the driver then acknowledges with
  ``scheduler.preempted`` and starts the next task. ``Submit``/``Resume``
  wait until the preempted task has acknowledged (or completed).
* Operator boundaries: a layer's compute is split over qkv_proj, attn,
  o_proj, gate_up_proj and down_proj in proportion to their FLOPs for the
  batch (:func:`operator_fractions`), as FlowPrefill §5.1 places its checks.
* Chunked prefill (``edf-cp2k``/``edf-cp8k``): the task is computed as
  chunks of ``chunk_tokens``; each chunk is its own forward pass in the
  compute model, attending to the chunks before it. The overhead modelled
  is what that costs the compute model over one pass of the whole task
  (per-pass weight streaming, the re-read prior KV's attention, a small pass
  running below peak) -- FlowPrefill §3.1 and Figure 3 name these causes
  (kernel launches, redundant KV-cache reads, under-utilization) and give
  no number in the text, so we take the compute model's own, not a constant.
  The task may switch only where a chunk ends (at the first operator
  boundary at or after the chunk's share of the work).

Network and compute together (``mfs+flowprefill``): given a ``pruned``
callable -- the hooks interface's ``pruned()`` (``laxflow.hooks.api``), in
the simulator :class:`PolicyHooks` over the flow policy's pruned set -- the
driver asks it on every arrival and completion event. A started task whose
requests are all pruned (MFS found they cannot meet their deadline on the
network) stops burning compute: a suspended one leaves Q_p, the running one
is preempted at its next boundary; both wait in ``deferred`` and are resumed
only when nothing else is waiting, running or suspended. (MFS prunes only
requests whose flows it has seen, i.e. started ones; a request still in Q_w
cannot be pruned yet.)
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from laxflow.integrations.prefill.base import Boundary, Preempt, PrefillScheduler, Task, yields_at
from laxflow.policy.config import MfsConfig
from laxflow.policy.mfs import MfsPolicy
from laxflow.sim.serving.plan import LayerPlan

if TYPE_CHECKING:
    from laxflow.sim.serving.batch import BatchRun

OPERATORS = ("qkv_proj", "attn", "o_proj", "gate_up_proj", "down_proj")


def operator_fractions(model: Any, new_tokens: Sequence[int], context_tokens: Sequence[int]) -> tuple[float, ...]:
    """Shares of a dense layer's FLOPs per operator (``OPERATORS`` order) for this batch.

    qkv: 2 N h (q + 2 kv) dims; attn: causal QK^T and PV, 2 x 2 n (ctx - n/2)
    x heads x head_dim per request; o: 2 N q h; gate_up: 2 N h 2 ffn; down: 2 N ffn h.
    """
    n_total = float(sum(new_tokens))
    h, hd = float(model.hidden), float(model.head_dim)
    q, kv = float(model.num_heads) * hd, float(model.num_kv_heads) * hd
    ffn = float(model.ffn_hidden) * max(1, int(getattr(model, "top_k", 1)))
    attn = sum(4.0 * n * max(1.0, c - n / 2.0) * q for n, c in zip(new_tokens, context_tokens))
    flops = (2 * n_total * h * (q + 2 * kv), attn, 2 * n_total * q * h, 4 * n_total * h * ffn, 2 * n_total * ffn * h)
    total = sum(flops)
    return tuple(f / total for f in flops)


def chunk_pieces(tokens: Sequence[tuple[int, int]], chunk: int) -> list[list[tuple[int, int]]]:
    """Split a task's requests ``(new, context)`` into chunks of at most ``chunk`` new tokens, in order.

    Each piece is ``(new, context)`` with context = the request's reused
    prefix + its tokens up to and including this piece.
    """
    out: list[list[tuple[int, int]]] = [[]]
    room = chunk
    for new, ctx in tokens:
        prefix = ctx - new
        done = 0
        while done < new:
            if room == 0:
                out.append([])
                room = chunk
            take = min(room, new - done)
            done += take
            out[-1].append((take, prefix + done))
            room -= take
    return [c for c in out if c]


class PrefillDriver:
    """One prefill unit executing what its scheduler decides (see the module docstring)."""

    def __init__(self, scheduler: PrefillScheduler, now: Callable[[], float],
                 start: Callable[[Task], "BatchRun"], pruned: Callable[[], set[str]] | None = None,
                 ranks: int = 1, later: Callable[[Callable[[], None]], None] | None = None) -> None:
        if ranks > 1 and not scheduler.rank_batches:
            raise ValueError(f"prefill scheduler {scheduler.name!r} forms no task over {ranks} attention-DP ranks")
        self.scheduler = scheduler
        self._pruned = pruned
        self.rank_tokens = [0] * ranks  # new tokens waiting or running on each attention-DP rank
        self.queued_tokens = 0  # new tokens waiting or running here (the router's load signal)
        # ``later(fn)``: call fn after every other arrival of this instant (None: at once).
        self._later = later
        self._arriving: list[Any] = []  # arrived this instant, not yet told to the scheduler
        self.deferred: list[Task] = []  # started tasks whose requests are all pruned (resumed when idle)
        self.deferrals = 0
        self._deferring: Task | None = None  # the running task being preempted because it was pruned
        self._now = now
        self._start = start  # builds and begins a BatchRun for a new task (the simulator's)
        self.runs: dict[int, "BatchRun"] = {}  # task id -> its batch (started tasks)
        self.tasks: dict[int, Task] = {}  # id(batch) -> task
        self.current: Task | None = None  # executing (maybe with its preemption signal raised)
        self.next: Task | None = None  # submitted or resumed, starts when ``current`` yields or completes
        self.switches = 0

    def arrival(self, request: Any) -> None:
        """``request`` (with ``new_tokens``) reached this unit: it joins the rank with the fewest new
        tokens waiting or running (ties: the lowest; its ``rank`` is set now), and the scheduler hears
        it with every other arrival of this instant (``later``), so they can batch together."""
        rank = min(range(len(self.rank_tokens)), key=lambda r: (self.rank_tokens[r], r))
        request.rank = rank
        self.rank_tokens[rank] += request.new_tokens
        self.queued_tokens += request.new_tokens
        self._arriving.append(request)
        if self._later is None:
            self._deliver()
        elif len(self._arriving) == 1:
            self._later(self._deliver)

    def _deliver(self) -> None:
        arrived, self._arriving = self._arriving, []
        self._apply(self.scheduler.arrivals(arrived, self._now()))
        self._defer_pruned()

    def compute_done(self, batch: "BatchRun") -> None:
        """The batch computed its last layer: the task's completion event (its ranks' load freed first)."""
        task = self.tasks.pop(id(batch))
        for r in task.requests:
            self.rank_tokens[r.rank] -= r.new_tokens
            self.queued_tokens -= r.new_tokens
        self.runs.pop(task.id, None)
        if task in self.deferred:  # never resume (recompute) a task that is done
            self.deferred.remove(task)
        if self.current is task:
            self.current = None
        if self._deferring is task:
            self._deferring = None
        self._apply(self.scheduler.completion(task, self._now()))
        self._defer_pruned()
        self._undefer_if_idle()

    def boundary(self, batch: "BatchRun", kind: int, progress: float) -> bool:
        """Asked by a batch whose signal is raised, at a boundary of ``kind``: suspend here?"""
        b = Boundary(kind)
        if not yields_at(b, self.scheduler.granularity):
            return False
        task = self.tasks[id(batch)]
        self.scheduler.preempted(task, b, progress, self._now())
        if self.current is task:
            self.current = None
        self.switches += 1
        if self._deferring is task:  # pruned: out of the scheduler's sight until the unit is idle
            self._deferring = None
            if self.scheduler.running is task:
                self.scheduler.running = None
            elif task in self.scheduler.suspended:
                self.scheduler.suspended.remove(task)
            if task not in self.deferred:  # the suspended-task path may have taken it already
                self.deferred.append(task)
                self.deferrals += 1
            self._apply(self.scheduler._round(self._now()))
            self._undefer_if_idle()
            return True
        self._maybe_start()
        return True

    # -- mfs+flowprefill: the network's pruned set reaches the scheduler ----------------

    def _defer_pruned(self) -> None:
        if self._pruned is None:
            return
        pruned = self._pruned()
        if not pruned:
            return
        for task in list(self.scheduler.suspended):
            # Not the one still executing toward its boundary (Preempt asked, not yet acknowledged):
            # it is deferred there, once; taking it here too would resume (and recompute) it twice.
            if task is not self.next and task is not self.current and all(r.id in pruned for r in task.requests):
                self.scheduler.suspended.remove(task)
                self.deferred.append(task)
                self.deferrals += 1
        cur = self.current
        if (cur is not None and self._deferring is None and self.scheduler.running is cur
                and all(r.id in pruned for r in cur.requests)
                and yields_at(Boundary.CHUNK, self.scheduler.granularity)):
            self._deferring = cur
            self.runs[cur.id].preempt_requested = True

    def _undefer_if_idle(self) -> None:
        """Nothing else to compute: give the scheduler back the oldest deferred task."""
        if self.deferred and self.scheduler.idle() and self.current is None and self.next is None:
            self.scheduler.suspended.append(self.deferred.pop(0))
            self._apply(self.scheduler._round(self._now()))

    def _apply(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Preempt):
                if self.current is action.task:
                    self.runs[action.task.id].preempt_requested = True
                elif self.next is action.task:
                    self.next = None  # not started yet: it simply stays suspended
            else:  # Submit or Resume
                self.next = action.task
        self._maybe_start()

    def _maybe_start(self) -> None:
        if self.current is not None or self.next is None:
            return
        task, self.next = self.next, None
        self.current = task
        run = self.runs.get(task.id)
        if run is None:
            run = self._start(task)
            self.runs[task.id] = run
            self.tasks[id(run)] = task
            run.begin()
        else:
            run.resume()


class PolicyHooks:
    """The hooks interface's ``pruned()`` in the simulator: the flow policy's pruned requests.

    The simulator's network runs the flow policy in process; MFS keeps the
    pruned set the coordinator would publish (``MfsPolicy.pruned_requests``).
    Other policies prune nothing.
    """

    def __init__(self, policy: Any) -> None:
        self._policy = policy

    def pruned(self) -> set[str]:
        return set(self._policy.pruned_requests or ())


class MfsPruning(MfsPolicy):
    """``mfs`` with Algorithm 1's pruning on when it runs alone (``drop_budget`` 1 per run).

    The simulator has no coordinator, and standalone ``mfs`` defaults to
    ``drop_budget`` 0 (``MfsConfig``: alone it sees only live bytes), so
    ``mfs+flowprefill`` never got a pruned set to act on. This policy is how
    the coupling is measured in the simulator:
    ``--policies laxflow.sim.serving.prefill_driver:MfsPruning``.
    """

    name = "mfs-prune"

    def __init__(self, config: Any = None, **options: Any) -> None:
        super().__init__(config if config is not None else MfsConfig.from_mapping({"drop_budget": 1, **options}))


def chunked_plan(plan: LayerPlan, whole: float, chunks: Sequence[float]) -> tuple[LayerPlan, tuple[float, ...]]:
    """``plan`` with its compute stretched to the chunks' total, and the chunk ends as work fractions."""
    total = sum(chunks)
    factor = total / whole if whole > 0 else 1.0
    segs = tuple(replace(s, seconds=s.seconds * factor) if s.kind == "compute" else s for s in plan.segments)
    marks, acc = [], 0.0
    for c in chunks[:-1]:
        acc += c
        marks.append(acc / total)
    return LayerPlan(segs, plan.compute * factor), tuple(marks)
