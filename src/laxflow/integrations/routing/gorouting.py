"""``gorouting`` (ProServe, paper 003 §4.3, Algorithm 2): gain-aware, capacity-reserving dispatch.

For every prefill instance the router estimates the first-token gain of its
queue with and without the new request (Delta_p); candidates are those
within ``alpha`` of the best Delta. Among candidates it takes the idlest
light one (load < ``mu`` TTFT), else the busiest one that stays under
``lam`` TTFT with the request -- keeping light instances free for later long
or high-priority requests -- else the idlest candidate. No positive gain
anywhere: a seeded random instance. Decode instance: most free KV blocks.

Gain estimates follow the paper's conservative choices: disaggregated, phi_p
(each queued prefill its own batch, in deadline order); colocated, phi_a
(every request finishes with the whole queue) plus ``n_d * b_d`` of decodes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Sequence

from laxflow.integrations.metrics.tdg import TdgWeights
from laxflow.integrations.prefill.iteration import SequenceView, build_config, check_choice, check_positive
from laxflow.integrations.prefill.latency import ProServeLatencyModel
from laxflow.integrations.routing.base import (
    InstanceView,
    QueuedPrefill,
    RouteDecision,
    Router,
    check_instances,
    most_free_decode,
)

SETTINGS = ("colocated", "disaggregated")


@dataclass(frozen=True)
class GoRoutingConfig:
    # alpha, mu, lam: the paper gives no values; these are ours, the same for every workload.
    setting: str = "disaggregated"
    alpha: float = 0.9  # candidate set: Delta_p >= alpha * Delta_max
    mu: float = 0.3  # light: estimated load < mu * TTFT_SLO
    lam: float = 0.8  # heavy: load with the request > lam * TTFT_SLO
    w_p: float = 1.0
    w_d: float = 1.0
    seed: int = 0  # RANDOMSELECT fallback

    def __post_init__(self) -> None:
        check_choice("GoRoutingConfig", "setting", self.setting, SETTINGS)
        check_positive("GoRoutingConfig", alpha=self.alpha, mu=self.mu, lam=self.lam)
        if not self.alpha <= 1:
            raise ValueError(f"GoRoutingConfig.alpha: must be in (0, 1], got {self.alpha!r}")
        if not self.mu <= self.lam:
            raise ValueError(f"GoRoutingConfig.mu: must be <= lam ({self.lam}), got {self.mu!r}")
        TdgWeights(self.w_p, self.w_d)


class GoRouting(Router):
    name = "gorouting"

    def __init__(self, model: ProServeLatencyModel, config: GoRoutingConfig = GoRoutingConfig()) -> None:
        self.model = model
        self.config = config
        self.rng = random.Random(config.seed)

    @classmethod
    def from_profile(cls, samples: Sequence[Any], **options: Any) -> "GoRouting":
        return cls(ProServeLatencyModel.fit(samples), build_config(GoRoutingConfig, options))

    def _lag(self, v: InstanceView, now: float) -> float:
        """ts_curr - ts_p: work the head prefill did since the router last heard from ``v``."""
        return max(0.0, now - v.queue_updated_at) if v.prefill_queue and math.isfinite(v.queue_updated_at) else 0.0

    def _decode_time(self, v: InstanceView) -> float:
        return v.decoding * self.model.decode(0) if self.config.setting == "colocated" else 0.0

    def estimate_exec(self, v: InstanceView, now: float, extra: QueuedPrefill | None = None) -> float:
        """ESTIMATEEXEC(p[, req]): seconds to drain ``v``'s prefill queue (with ``extra``)."""
        queue = v.prefill_queue + ((extra,) if extra else ())
        work = sum(self.model.prefill(q.prompt_tokens, 0) for q in queue)
        if self.config.setting == "disaggregated":
            work += len(queue) * self.model.overhead
        return max(0.0, work + self._decode_time(v) - self._lag(v, now))

    def estimate_gain(self, v: InstanceView, queue: Sequence[QueuedPrefill], now: float, tpot_slo: float) -> float:
        """ESTIMATEGAIN(Q): first-token TDG the queue would capture on ``v``."""
        if not queue:
            return 0.0
        w_p, lag = self.config.w_p, self._lag(v, now)
        execs = [self.model.prefill(q.prompt_tokens, 0) for q in queue]
        if self.config.setting == "disaggregated":
            gain, t = 0.0, now - lag
            for e, q in sorted(zip(execs, queue), key=lambda p: (p[1].deadline, p[1].id)):
                t += e + self.model.overhead
                gain += w_p * q.weight if t < q.deadline else 0.0
            return gain
        t_c = self.model.overhead
        t_budget = min(min(q.deadline for q in queue) - now, tpot_slo)
        scale = t_budget / (t_budget - t_c) if t_budget > t_c else math.inf
        finish = now + scale * sum(execs) + self._decode_time(v) - lag
        return sum(w_p * q.weight for q in queue if finish < q.deadline)

    def route(self, request: SequenceView, instances: Sequence[InstanceView], now: float,
              decode_instances: Sequence[InstanceView] = ()) -> RouteDecision:
        check_instances(self.name, instances)
        cfg, ttft = self.config, request.ttft_slo
        new = QueuedPrefill(request.id, request.remaining_prefill, request.deadline(), request.weight)
        deltas = []
        for v in instances:
            pre = self.estimate_gain(v, v.prefill_queue, now, request.tpot_slo)
            post = self.estimate_gain(v, v.prefill_queue + (new,), now, request.tpot_slo)
            deltas.append(post - pre)
        d_max = max(deltas)
        if d_max <= 0:
            pick = self.rng.choice(list(instances))
            return RouteDecision(pick.id, most_free_decode(decode_instances))
        cands = [v for v, d in zip(instances, deltas) if d >= cfg.alpha * d_max]
        load = {v.id: self.estimate_exec(v, now) for v in cands}
        light = [v for v in cands if load[v.id] < cfg.mu * ttft]
        heavy = {v.id for v in cands if self.estimate_exec(v, now, new) > cfg.lam * ttft}
        if light:
            pick = min(light, key=lambda v: load[v.id])
        elif any(v.id not in heavy for v in cands):
            pick = max((v for v in cands if v.id not in heavy), key=lambda v: load[v.id])
        else:
            pick = min(cands, key=lambda v: load[v.id])
        return RouteDecision(pick.id, most_free_decode(decode_instances))
