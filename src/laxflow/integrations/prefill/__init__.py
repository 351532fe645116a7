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
from laxflow.integrations.prefill.registry import (
    create_prefill_scheduler,
    prefill_scheduler_class,
    prefill_scheduler_names,
    register_prefill_scheduler,
)

__all__ = [
    "Action", "Boundary", "PrefillRequest", "PrefillScheduler", "Preempt", "Resume", "Submit", "Task",
    "TtftPredictor", "yields_at", "create_prefill_scheduler", "prefill_scheduler_class",
    "prefill_scheduler_names", "register_prefill_scheduler",
]
