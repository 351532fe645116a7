"""``minload`` router (ProServe's multi-node baseline): the instance with the least queued prefill time.

Load is GoRouting's ESTIMATEEXEC (same latency model, same setting), so the
two routers differ only in the choice rule.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.integrations.prefill.iteration import SequenceView, build_config
from laxflow.integrations.prefill.latency import ProServeLatencyModel
from laxflow.integrations.routing.base import InstanceView, RouteDecision, check_instances, most_free_decode
from laxflow.integrations.routing.gorouting import GoRouting, GoRoutingConfig


class MinLoad(GoRouting):
    name = "minload"

    def __init__(self, model: ProServeLatencyModel, config: GoRoutingConfig = GoRoutingConfig()) -> None:
        super().__init__(model, config)

    @classmethod
    def from_profile(cls, samples: Sequence[Any], **options: Any) -> "MinLoad":
        return cls(ProServeLatencyModel.fit(samples), build_config(GoRoutingConfig, options))

    def route(self, request: SequenceView, instances: Sequence[InstanceView], now: float,
              decode_instances: Sequence[InstanceView] = ()) -> RouteDecision:
        check_instances(self.name, instances)
        pick = min(instances, key=lambda v: self.estimate_exec(v, now))
        return RouteDecision(pick.id, most_free_decode(decode_instances))
