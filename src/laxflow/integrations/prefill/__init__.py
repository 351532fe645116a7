"""Prefill scheduling policies (FlowPrefill and baselines), pure; see ``base.py`` for the driving protocol."""

from laxflow.integrations.prefill.base import (
    Action,
    Boundary,
    PrefillRequest,
    PrefillScheduler,
    Preempt,
    Resume,
    Submit,
    Task,
    TtftPredictor,
    yields_at,
)
from laxflow.integrations.prefill.iteration import (
    BatchEntry,
    BatchSample,
    BatchScheduler,
    IterationBatch,
    SequenceView,
    token_deadline,
)
from laxflow.integrations.prefill.registry import (
    batch_scheduler_class,
    batch_scheduler_names,
    create_batch_scheduler,
    create_prefill_scheduler,
    prefill_scheduler_class,
    prefill_scheduler_names,
    register_prefill_scheduler,
)

__all__ = [
    "Action", "Boundary", "PrefillRequest", "PrefillScheduler", "Preempt", "Resume", "Submit", "Task",
    "TtftPredictor", "yields_at", "create_prefill_scheduler", "prefill_scheduler_class",
    "prefill_scheduler_names", "register_prefill_scheduler",
    # iteration-level batch schedulers (FairBatching, SlideBatching, Sarathi and its variants)
    "BatchEntry", "BatchSample", "BatchScheduler", "IterationBatch", "SequenceView", "token_deadline",
    "batch_scheduler_class", "batch_scheduler_names", "create_batch_scheduler",
]
