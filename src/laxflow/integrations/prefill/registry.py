"""Name -> prefill scheduler class, imported lazily; names are unique (:class:`laxflow.registry.Registry`)."""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.prefill.base import PrefillScheduler, TtftPredictor
from laxflow.integrations.prefill.iteration import BatchSample, BatchScheduler
from laxflow.registry import Registry

_SCHEDULERS: Registry[PrefillScheduler] = Registry("prefill scheduler", PrefillScheduler, {
    "flowprefill": "laxflow.integrations.prefill.flowprefill:FlowPrefill",
    "fcfs": "laxflow.integrations.prefill.fcfs:Fcfs",
    "edf-cp2k": "laxflow.integrations.prefill.edf:EdfChunked2k",
    "edf-cp8k": "laxflow.integrations.prefill.edf:EdfChunked8k",
    "edf-layer": "laxflow.integrations.prefill.edf:EdfLayer",
})


def register_prefill_scheduler(name: str, target: str | type[PrefillScheduler]) -> None:
    """Add a scheduler under ``name`` (a class or a lazy ``module:Class``)."""
    _SCHEDULERS.register(name, target)


def prefill_scheduler_names() -> list[str]:
    return _SCHEDULERS.names()


def prefill_scheduler_class(name: str) -> type[PrefillScheduler]:
    """The class for ``name`` (or ``module:Class``); raises ValueError naming the valid choices."""
    return _SCHEDULERS.get(name)


def create_prefill_scheduler(name: str, predictor: TtftPredictor, token_budget: int = 8192) -> PrefillScheduler:
    """A fresh scheduler (one per prefill instance)."""
    return prefill_scheduler_class(name)(predictor, token_budget)


# Iteration-level batch schedulers (``iteration.py``): a separate name space,
# because they are driven per step with a snapshot, not with Submit/Preempt.
_BATCH_SCHEDULERS: Registry[BatchScheduler] = Registry("batch scheduler", BatchScheduler, {
    "fairbatching": "laxflow.integrations.prefill.fairbatching:FairBatching",
    "fairbatching-pab": "laxflow.integrations.prefill.fairbatching:FairBatchingPab",
    "sarathi": "laxflow.integrations.prefill.sarathi:Sarathi",
    "slidebatching": "laxflow.integrations.prefill.slidebatching:SlideBatching",
    "edf": "laxflow.integrations.prefill.edf_batching:EdfBatching",
    "sjf": "laxflow.integrations.prefill.sjf:Sjf",
    "priority": "laxflow.integrations.prefill.priority:Priority",
    "vllm": "laxflow.integrations.prefill.vllm_default:VllmDefault",
    "weighted-vtc": "laxflow.integrations.prefill.vtc:WeightedVtc",
})


def batch_scheduler_names() -> list[str]:
    return _BATCH_SCHEDULERS.names()


def batch_scheduler_class(name: str) -> type[BatchScheduler]:
    """The iteration-level scheduler class for ``name`` (or ``module:Class``); raises ValueError naming the valid choices."""
    return _BATCH_SCHEDULERS.get(name)


def create_batch_scheduler(name: str, samples: Sequence[BatchSample], **options: Any) -> BatchScheduler:
    """A fresh scheduler (one per instance) with its latency model fitted to ``samples`` (BatchSample list)."""
    return batch_scheduler_class(name).from_profile(samples, **options)
