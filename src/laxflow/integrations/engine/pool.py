"""Execution pool: runs at most one prefill task and keeps preempted ones (FlowPrefill §4, §5.1).

The engine's scheduler thread calls :meth:`ExecutionPool.submit`,
:meth:`preempt` and :meth:`resume` (the actions of
``laxflow.integrations.prefill``); one worker thread (:meth:`run`) executes
the commands in order, one operator at a time, and reports back through
``on_event(kind, task, payload)`` from the worker thread:
``("preempted", task, (boundary, progress))`` when it suspended a task the
scheduler asked to preempt, ``("completed", task, logits)`` when a task ends.

Preemption is cooperative (Figure 7): ``preempt`` only raises a flag; the
worker tests it at the check points placed at ``granularity`` (after every
operator, or after every layer's down_proj) and suspends there, keeping the
:class:`ForwardState`. A later command for that task continues it.

Tensor parallelism: every rank runs a pool over its model shard. Rank 0's
pool (the leader) gets the scheduler's commands; before running one it sends
it to the other ranks through ``collective.agree_command``, and the followers
(:meth:`follow`) run exactly the commands the leader runs. At each check
point all ranks call ``collective.agree_flag`` (an all_reduce MAX of their
local flags) so they suspend at the same operator counter or none does: a
rank never waits in an all_reduce its peer will not reach. A flag raised on
a rank without a scheduler request (``inject_preempt``, used by the
deadlock tests) suspends every rank too; the leader then resumes the same
task at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Protocol

from laxflow.integrations.engine.model import ForwardState, LlamaModel
from laxflow.integrations.prefill.base import Boundary, Task, yields_at


class LayerHooks(Protocol):
    """What the pool calls, once per task (batch) and layer, on its worker thread only.

    The signatures are those of ``laxflow.hooks.Hooks`` (daemon branch), so a
    ``HooksClient`` or ``InProcessHooks`` plugs in as is; anything with these
    methods does. ``batch`` is :func:`batch_name` of the task. If the object
    also has ``batch_formed(batch, requests)`` it is called once, before the
    task's first layer, with the request ids. Exceptions raised by a hook are
    counted in ``ExecutionPool.hook_errors`` and otherwise ignored: a hook
    never stops a prefill.
    """

    def layer_begin(self, batch: str, layer: int) -> None: ...

    def layer_end(self, batch: str, layer: int, last: bool = False) -> None: ...


def batch_name(task: Task) -> str:
    """The batch id hooks see for ``task``."""
    return f"prefill-{task.id}"


class Collective(Protocol):
    """How the ranks of one TP group agree; ``LocalCollective`` when there is one rank."""

    def agree_flag(self, local: bool) -> bool: ...

    def agree_command(self, command: Any) -> Any: ...


class LocalCollective:
    def agree_flag(self, local: bool) -> bool:
        return local

    def agree_command(self, command: Any) -> Any:
        return command


_STOP = ("stop", None)


class ExecutionPool:
    """One worker thread running tasks operator by operator; suspended states by task id."""

    def __init__(
        self,
        model: LlamaModel,
        granularity: Boundary = Boundary.OPERATOR,
        hooks: LayerHooks | None = None,
        on_event: Callable[[str, Task, Any], None] | None = None,
        collective: Collective | None = None,
    ) -> None:
        if granularity not in (Boundary.OPERATOR, Boundary.LAYER, Boundary.NEVER):
            raise ValueError(f"the engine places checks at operator or layer boundaries, not {granularity.name}")
        self.model, self.granularity, self.hooks = model, granularity, hooks
        self.on_event = on_event or (lambda kind, task, payload: None)
        self.collective = collective or LocalCollective()
        self._cv = threading.Condition()
        self._commands: deque[tuple[str, Task | None]] = deque()
        self._suspended: dict[int, ForwardState | None] = {}  # None: preempted before it started
        self._current: Task | None = None
        self._finished: set[int] = set()  # ids of completed tasks (leader)
        self._flag = threading.Event()  # the preemption signal the worker tests
        self._requested: Task | None = None  # the running task the scheduler asked to preempt
        self._signal_at = 0.0
        self.blocking_s: list[float] = []  # signal raised -> task suspended, per requested preemption
        self.yielded_at: list[float] = []  # time.perf_counter() of each requested suspension
        self.yields: list[tuple[int, Boundary, int, int, int]] = []  # (task id, kind, layer, op, ops_done)
        self.hook_errors = 0

    # -- scheduler thread -------------------------------------------------
    def submit(self, task: Task) -> None:
        self._push(("run", task))

    def resume(self, task: Task) -> None:
        """Continue ``task``; also valid while it still runs with its signal raised (it then
        suspends at the check point and this command continues it)."""
        with self._cv:
            if task.id not in self._suspended and self._current is not task:
                raise ValueError(f"resume of {task!r}, which is neither suspended nor running")
            self._commands.append(("run", task))
            self._cv.notify()

    def preempt(self, task: Task) -> None:
        """Raise ``task``'s signal if it runs and drop its queued commands (it stays suspended)."""
        with self._cv:
            queued = [cmd for cmd in self._commands if cmd[1] is task]
            for cmd in queued:
                self._commands.remove(cmd)
            if self._current is task:
                if not self._flag.is_set() or self._requested is not task:
                    self._signal_at = time.perf_counter()
                self._requested = task
                self._flag.set()
            elif queued:
                self._suspended.setdefault(task.id, None)

    def inject_preempt(self) -> None:
        """Raise the flag without a scheduler request (tests: random preemption on any rank)."""
        self._flag.set()

    def close(self) -> None:
        self._push(_STOP)

    def _push(self, cmd: tuple[str, Task | None]) -> None:
        with self._cv:
            self._commands.append(cmd)
            self._cv.notify()

    # -- worker thread ----------------------------------------------------
    def run(self) -> None:
        """The leader's worker loop; returns after ``close``."""
        while True:
            with self._cv:
                while not self._commands:
                    self._cv.wait()
                cmd = self._commands.popleft()
                if cmd[1] is not None:
                    if cmd[1].id in self._finished:  # a resume raced with the task's completion
                        continue
                    self._current = cmd[1]
            cmd = self.collective.agree_command(cmd)
            if cmd is _STOP or cmd[0] == "stop":
                return
            self._execute(cmd[1], leader=True)

    def follow(self) -> None:
        """A follower rank's loop: run what the leader runs; returns when the leader closes."""
        while True:
            cmd = self.collective.agree_command(None)
            if cmd[0] == "stop":
                return
            with self._cv:
                self._current = cmd[1]
            self._execute(cmd[1], leader=False)

    def _execute(self, task: Task, leader: bool) -> None:
        state = self._suspended.pop(task.id, None)
        if state is None:
            state = self.model.start([r.payload for r in task.requests])
            if self.hooks is not None and hasattr(self.hooks, "batch_formed"):
                self._hook("batch_formed", batch_name(task), [r.id for r in task.requests])
        last_layer = self.model.config.layers - 1
        while True:
            if state.op == 0:
                self._hook("layer_begin", batch_name(task), state.layer)
            self.model.run_op(state)
            if state.op == 0:
                self._hook("layer_end", batch_name(task), state.layer - 1, state.layer - 1 == last_layer)
            if state.done:
                break
            kind = Boundary.LAYER if state.op == 0 else Boundary.OPERATOR
            if yields_at(kind, self.granularity) and self.collective.agree_flag(self._flag.is_set()):
                self._suspend(task, state, kind, leader)
                return
        with self._cv:
            self._current, self._requested = None, None
            self._finished.add(task.id)
            self._flag.clear()
        self.on_event("completed", task, state.logits)

    def _suspend(self, task: Task, state: ForwardState, kind: Boundary, leader: bool) -> None:
        now = time.perf_counter()
        self.yields.append((task.id, kind, state.layer, state.op, state.ops_done))
        self._suspended[task.id] = state
        with self._cv:
            requested = self._requested is task
            self._current, self._requested = None, None
            self._flag.clear()
            if requested:
                self.blocking_s.append(now - self._signal_at)
                self.yielded_at.append(now)
            elif leader:  # nobody asked: go on with the same task
                self._commands.appendleft(("run", task))
        if requested:
            self.on_event("preempted", task, (kind, state.ops_done / self.model.total_ops))

    def _hook(self, name: str, *args: Any) -> None:
        if self.hooks is None:
            return
        try:
            getattr(self.hooks, name)(*args)
        except Exception:  # a hook never stops a prefill
            self.hook_errors += 1
