"""The prefill engine: a prefill scheduler driving an execution pool on event (FlowPrefill Fig. 5).

A user thread calls :meth:`PrefillEngine.add_request`; the pool's worker
thread reports completions and acknowledged preemptions. Both only enqueue an
event; the engine's scheduler thread (the Event Monitor of §4) takes them one
at a time, calls the scheduler (``arrival`` / ``completion`` / ``preempted``,
the protocol of ``laxflow.integrations.prefill.base``) and hands the actions
to the pool in order. Deadlines and the scheduler's ``now`` are on
``time.monotonic()``.

With tensor parallelism, rank 0 runs a ``PrefillEngine`` whose pool is the
leader and the other ranks run ``ExecutionPool.follow`` (see ``tp.py``).

Network and compute together (``network=``, a second ``laxflow.hooks``
client: ZeroMQ sockets are per thread, and ``hooks`` belongs to the pool's
worker): the scheduler thread registers each arriving request with the
daemon (its deadline on the daemon's wall clock), asks ``network.pruned()``
on every event and, if the client has ``subscribe_pruned``, also gets the
daemon's pruning advice as an event. Started tasks whose requests are all
pruned are deferred (``PrefillScheduler.defer``): their compute goes to
requests that can still meet their deadline.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Sequence

import torch

from laxflow.integrations.engine.model import LlamaModel
from laxflow.integrations.engine.pool import Collective, ExecutionPool, LayerHooks
from laxflow.integrations.prefill.base import (
    Boundary,
    PrefillRequest,
    PrefillScheduler,
    Preempt,
    Resume,
    Submit,
    Task,
    TtftPredictor,
)


def profile_predictor(model: LlamaModel, max_tokens: int, points: int = 5, degree: int = 2) -> TtftPredictor:
    """Time uninterrupted prefills of ``points`` sizes up to ``max_tokens`` and fit the TTFT predictor.

    Called once before building an engine (single-rank models only: a TP
    model's forward needs its peers).
    """
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab

    def seconds(n: int) -> float:
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        begin = time.perf_counter()
        model.forward([ids])
        return time.perf_counter() - begin

    seconds(min(16, max_tokens))  # warm-up: first-call allocations are not prefill time
    return TtftPredictor.from_function(seconds, max_tokens, points=max(points, degree + 1), degree=degree)


class PrefillEngine:
    """Scheduler thread + execution pool; requests in, last-token logits out."""

    def __init__(
        self,
        model: LlamaModel,
        scheduler: PrefillScheduler,
        hooks: LayerHooks | None = None,
        granularity: Boundary | None = None,
        collective: Collective | None = None,
        network: Any = None,
    ) -> None:
        """``granularity`` places the pool's checks (default: the scheduler's own); the
        preemption bench sets it to compare operator and layer checks under one policy.
        ``network``: an object with ``pruned()`` (a ``HooksClient`` of its own, see the
        module docstring), used on the scheduler thread only; None: no coupling."""
        self.scheduler = scheduler
        self.network = network
        self._pruned: set[str] = set()  # the last pruned set the daemon advised
        self.pool = ExecutionPool(
            model, scheduler.granularity if granularity is None else granularity, hooks, self._post, collective
        )
        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._results: dict[str, torch.Tensor] = {}
        self._done: dict[str, threading.Event] = {}
        self.completed_tasks: list[tuple[Task, torch.Tensor]] = []
        self.errors: list[BaseException] = []
        self._worker = threading.Thread(target=self.pool.run, name="laxflow-pool", daemon=True)
        self._sched = threading.Thread(target=self._loop, name="laxflow-scheduler", daemon=True)

    def start(self) -> "PrefillEngine":
        self._worker.start()
        self._sched.start()
        subscribe = getattr(self.network, "subscribe_pruned", None)
        if callable(subscribe):  # advice arrives on the client's thread: only enqueue it
            subscribe(lambda pruned: self._events.put(("pruned", set(pruned))))
        return self

    def __enter__(self) -> "PrefillEngine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, timeout: float = 30.0) -> None:
        """Stop both threads (after the pool finishes its current operator)."""
        self._events.put(("stop",))
        self._sched.join(timeout)
        self.pool.close()
        self._worker.join(timeout)

    def add_request(self, token_ids: Sequence[int], slo: float, request_id: str | None = None) -> PrefillRequest:
        """Queue a prefill of ``token_ids`` due ``slo`` seconds from now (any thread)."""
        if slo <= 0:
            raise ValueError(f"slo must be > 0 s, got {slo}")
        now = time.monotonic()
        rid = request_id if request_id is not None else f"r{next(self._ids)}"
        request = PrefillRequest(rid, now, now + slo, len(token_ids), list(token_ids))
        with self._lock:
            if rid in self._done:
                raise ValueError(f"duplicate request id {rid!r}")
            self._done[rid] = threading.Event()
        self._events.put(("arrival", request))
        return request

    def result(self, request_id: str, timeout: float | None = None) -> torch.Tensor:
        """The request's last-token logits; waits up to ``timeout`` s (TimeoutError after)."""
        if not self._done[request_id].wait(timeout):
            raise TimeoutError(f"request {request_id!r} not done after {timeout} s")
        return self._results[request_id]

    def _post(self, kind: str, task: Task, payload: Any) -> None:
        self._events.put((kind, task, payload))

    def _loop(self) -> None:
        while True:
            event = self._events.get()
            now = time.monotonic()
            try:
                if event[0] == "stop":
                    return
                if event[0] == "pruned":
                    self._pruned = event[1]
                elif event[0] == "arrival":
                    self._register(event[1], now)
                    self._apply(self.scheduler.arrival(event[1], now))
                elif event[0] == "preempted":
                    kind, progress = event[2]
                    self.scheduler.preempted(event[1], kind, progress, now)
                elif event[0] == "completed":
                    task, logits = event[1], event[2]
                    self.completed_tasks.append((task, logits))
                    for row, request in enumerate(task.requests):
                        self._results[request.id] = logits[row]
                        self._done[request.id].set()
                    self._apply(self.scheduler.completion(task, now))
                self._defer(now)
            except Exception as exc:  # keep serving: the error is kept for the caller to see
                self.errors.append(exc)

    def _register(self, request: PrefillRequest, now: float) -> None:
        """Tell the daemon the request's deadline (its clock is the wall clock)."""
        register = getattr(self.network, "register_request", None)
        if callable(register):
            register(request.id, time.time() + (request.deadline - now), request.new_tokens)

    def _defer(self, now: float) -> None:
        """Ask the network which requests it gave up on; defer their tasks (no-op without ``network``)."""
        if self.network is None:
            return
        polled = self.network.pruned()  # the client fails open: an empty set if the daemon is away
        pruned = set(polled) | self._pruned if polled is not None else self._pruned
        self._apply(self.scheduler.defer(pruned, now))

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Preempt):
                self.pool.preempt(action.task)
            elif isinstance(action, Submit):
                self.pool.submit(action.task)
            elif isinstance(action, Resume):
                self.pool.resume(action.task)
