"""``priority`` baseline = ProServe's Sarathi-Priority: decodes first, then prefills by weight, then arrival."""

from __future__ import annotations

from laxflow.integrations.prefill.iteration import SequenceView
from laxflow.integrations.prefill.sarathi import Sarathi


class Priority(Sarathi):
    name = "priority"

    def prefill_key(self, s: SequenceView, now: float) -> tuple:
        return (-s.weight, s.arrival, s.id)
