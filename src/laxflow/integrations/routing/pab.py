"""``pab`` router (FairBatching §3.4): send a request where the Prefill Admission Budget is largest.

Each instance reports its PAB (``prefill.fairbatching.prefill_admission_budget``)
after every step; between reports the router subtracts the prompt tokens it
sent, so a burst spreads before the next report arrives.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.prefill.iteration import SequenceView, build_config
from laxflow.integrations.routing.base import InstanceView, RouteDecision, Router, check_instances, most_free_decode
from dataclasses import dataclass


@dataclass(frozen=True)
class PabConfig:
    pass


class PabRouter(Router):
    name = "pab"

    def __init__(self) -> None:
        self._view: dict[str, tuple[float, float]] = {}  # id -> (reported_at, budget left in our view)

    @classmethod
    def from_profile(cls, samples: Sequence[Any], **options: Any) -> "PabRouter":
        build_config(PabConfig, options)
        return cls()

    def budget(self, v: InstanceView) -> float:
        seen = self._view.get(v.id)
        if seen is None or v.reported_at > seen[0]:
            self._view[v.id] = seen = (v.reported_at, v.pab)
        return seen[1]

    def route(self, request: SequenceView, instances: Sequence[InstanceView], now: float,
              decode_instances: Sequence[InstanceView] = ()) -> RouteDecision:
        check_instances(self.name, instances)
        # The largest budget: enough for the prompt if any instance has it,
        # and otherwise the least overcommitted one.
        best = max(instances, key=lambda v: self.budget(v))
        reported_at, left = self._view[best.id]
        self._view[best.id] = (reported_at, left - request.remaining_prefill)
        return RouteDecision(best.id, most_free_decode(decode_instances))
