"""``dplb`` router: vLLM's data-parallel load balancing by request counts (FairBatching's baseline).

Score ``4 * waiting + running``, lowest wins (vLLM v1 ``DPLBAsyncMPClient``);
the router counts the request it just sent as waiting until the instance's
next report (a newer ``reported_at``) replaces its counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from laxflow.integrations.prefill.iteration import SequenceView, build_config
from laxflow.integrations.routing.base import InstanceView, RouteDecision, Router, check_instances, most_free_decode

WAITING_WEIGHT = 4  # vLLM: a waiting request costs TTFT, a running one only some TPOT


@dataclass(frozen=True)
class DplbConfig:
    pass


class DplbRouter(Router):
    name = "dplb"

    def __init__(self) -> None:
        self._view: dict[str, tuple[float, int, int]] = {}  # id -> (reported_at, waiting, running)

    @classmethod
    def from_profile(cls, samples: Sequence[Any], **options: Any) -> "DplbRouter":
        build_config(DplbConfig, options)
        return cls()

    def counts(self, v: InstanceView) -> tuple[int, int]:
        seen = self._view.get(v.id)
        if seen is None or v.reported_at > seen[0]:
            self._view[v.id] = seen = (v.reported_at, v.waiting, v.running)
        return seen[1], seen[2]

    def route(self, request: SequenceView, instances: Sequence[InstanceView], now: float,
              decode_instances: Sequence[InstanceView] = ()) -> RouteDecision:
        check_instances(self.name, instances)
        scores = []
        for k, v in enumerate(instances):
            waiting, running = self.counts(v)
            scores.append((WAITING_WEIGHT * waiting + running, k))
        best = instances[min(scores)[1]]
        reported_at, waiting, running = self._view[best.id]
        self._view[best.id] = (reported_at, waiting + 1, running)
        return RouteDecision(best.id, most_free_decode(decode_instances))
