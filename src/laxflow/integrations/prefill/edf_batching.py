"""``edf`` baseline (ProServe §5.1): Sarathi's step, prefills by earliest first-token deadline."""

from __future__ import annotations

from laxflow.integrations.prefill.iteration import SequenceView
from laxflow.integrations.prefill.sarathi import Sarathi


class EdfBatching(Sarathi):
    name = "edf"

    def prefill_key(self, s: SequenceView, now: float) -> tuple:
        return (s.deadline(), s.arrival, s.id)
