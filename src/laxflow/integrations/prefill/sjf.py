"""``sjf`` baseline (ProServe §5.1): Sarathi's step, prefills by fewest prompt tokens left."""

from __future__ import annotations

from laxflow.integrations.prefill.iteration import SequenceView
from laxflow.integrations.prefill.sarathi import Sarathi


class Sjf(Sarathi):
    name = "sjf"

    def prefill_key(self, s: SequenceView, now: float) -> tuple:
        return (s.remaining_prefill, s.arrival, s.id)
