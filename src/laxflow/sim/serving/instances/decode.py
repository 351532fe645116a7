"""Decode instances: their batch former (every decode, within KV memory) and the unit engine's decode units.

:class:`DecodeAll` is called by :class:`.instance.Instance` before each step when its role is
``decode``. A decode instance holds sequences whose prompt KV arrived over
the network; each step runs one token of every one of them (continuous
batching, as vLLM and DistServe decode instances do), oldest first when KV
is short. A sequence that was preempted there (recompute) prefills again in
chunks of at most ``token_budget`` tokens after the decodes.

:class:`DecodeUnits` runs the unit-level engine's decode units as such
instances (``ServingConfig.decode = "steps"``): one per decode unit, each a
replica of the deployment timed by :class:`.profile.StepTimer` with vLLM's
KV sizing, stepping on the simulator's event queue and thread. A request
joins its unit when its last P2D byte lands, with its prompt's KV and its
first token (seen then), and decodes its other output tokens there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from laxflow.errors import UserError
from laxflow.integrations.prefill.iteration import (
    BatchEntry,
    BatchSample,
    BatchScheduler,
    IterationBatch,
    SequenceView,
    TokenBudgetConfig,
    build_config,
)
from laxflow.sim.serving.instances.instance import Instance, Seq, check_kv_fits
from laxflow.sim.serving.instances.profile import StepTimer


@dataclass(frozen=True)
class DecodeAllConfig(TokenBudgetConfig):
    """``token_budget``: the recompute chunk after the decodes (512, Sarathi's default)."""


class DecodeAll(BatchScheduler):
    name = "decode-all"
    config_class = DecodeAllConfig

    def __init__(self, config: DecodeAllConfig = DecodeAllConfig()) -> None:
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[BatchSample], **options: Any) -> "DecodeAll":
        return cls(build_config(DecodeAllConfig, options))

    def schedule(self, sequences: Sequence[SequenceView], now: float, kv_free_tokens: int | None = None) -> IterationBatch:
        left = float("inf") if kv_free_tokens is None else kv_free_tokens
        entries: list[BatchEntry] = []
        for s in sorted((s for s in sequences if not s.is_prefill), key=lambda s: (s.arrival, s.id)):
            if left < 1:
                break
            entries.append(BatchEntry(s.id, 1, False))
            left -= 1
        budget = self.config.token_budget
        for s in sorted((s for s in sequences if s.is_prefill), key=lambda s: (s.arrival, s.id)):
            take = int(min(budget, left, s.remaining_prefill))
            if take < 1:
                break
            entries.append(BatchEntry(s.id, take, True))
            budget -= take
            left -= take
        return IterationBatch(tuple(entries), 0.0, 0.0)


class DecodeUnits:
    """The unit engine's decode units as decode-role instances (module docstring)."""

    def __init__(self, queue: Any, deployment: Any, units: int, gpu_memory_utilization: float,
                 finished: Callable[[Seq], None]) -> None:
        self.queue = queue
        self.timer = StepTimer(deployment)
        self.kv_capacity = self.timer.kv_capacity_tokens(gpu_memory_utilization)  # tokens per unit
        if self.kv_capacity < 1:
            raise UserError(f"--decode steps: deployment {self.timer.dep.name!r} leaves no GPU memory for KV")
        self.instances = [Instance(f"d{k}", "decode", {"decode": DecodeAll()}, self.kv_capacity, self.timer)
                          for k in range(units)]
        self._finished = finished

    def check(self, request_id: str, prompt: int, outputs: int) -> None:
        """Raise UserError unless a request of ``prompt`` + ``outputs`` tokens fits a unit's KV memory."""
        check_kv_fits(request_id, prompt, outputs, self.kv_capacity, "a decode unit", self.timer.dep.name)

    def join(self, unit: int, seq: Seq) -> None:
        """``seq`` (prompt computed, first token seen now) decodes on decode unit ``unit`` from now."""
        inst = self.instances[unit]
        inst.add(seq)
        inst.kick(self.queue, self._step_end)

    def _step_end(self, inst: Instance) -> None:
        _, finished = inst.end_step(self.queue.now)
        for s in finished:
            self._finished(s)
        inst.kick(self.queue, self._step_end)
