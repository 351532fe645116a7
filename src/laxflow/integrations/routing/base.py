"""The request-router interface: a cluster snapshot and one new request in, one placement out.

A router picks, for each arriving request, the instance that runs its
prefill (and, for a PD-disaggregated cluster, the decode instance). It sits
above the per-instance batch schedulers (``prefill/iteration.py``).

Who calls: the simulator's cluster front end on each arrival event, or the
serving job's global scheduler / DP coordinator (one thread) for each
request it receives. Protocol:

1. Build one ``InstanceView`` per prefill-capable instance (and one per
   decode instance for a disaggregated cluster) from what the instances last
   reported; a router never asks an instance anything.
2. ``decision = router.route(request, prefill_views, now, decode_views)``.
3. Send the request to ``decision.prefill`` (and later its KV to
   ``decision.decode``). A router may keep a local view between reports
   (``pab`` decrements the budget it just spent; FairBatching §3.4); that
   view is reset whenever a view carries a newer ``reported_at``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from laxflow.integrations.prefill.iteration import SequenceView


@dataclass(frozen=True)
class QueuedPrefill:
    """A prefill the router placed on an instance and has not seen finish (ProServe's PrefillQueueMap)."""

    id: str
    prompt_tokens: int
    deadline: float  # absolute first-token deadline
    weight: float = 1.0  # priority weight w_p(r)


@dataclass(frozen=True)
class InstanceView:
    """One instance as the router knows it; each router reads only the fields its paper uses.

    - ``waiting``/``running``: request counts (vLLM's DP load balancer, ``dplb``).
    - ``pab``: last reported Prefill Admission Budget in tokens, ``reported_at``
      the time of that report (``pab``).
    - ``prefill_queue`` and ``queue_updated_at`` (ts_p), ``decoding`` (n_d),
      ``free_kv_blocks``: ProServe's view (``gorouting``, ``minload``).
    """

    id: str
    waiting: int = 0
    running: int = 0
    pab: float = 0.0
    reported_at: float = -math.inf
    prefill_queue: tuple[QueuedPrefill, ...] = ()
    queue_updated_at: float = -math.inf
    decoding: int = 0
    free_kv_blocks: int = 0


@dataclass(frozen=True)
class RouteDecision:
    prefill: str
    decode: str | None = None  # None on a colocated cluster (decode stays on ``prefill``)


class Router(ABC):
    """Places requests; one per cluster front end."""

    name: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def from_profile(cls, samples: Sequence[Any], **options: Any) -> "Router":
        """A router whose time estimates (if any) are fitted to ``samples`` (BatchSample list)."""

    @abstractmethod
    def route(self, request: SequenceView, instances: Sequence[InstanceView], now: float,
              decode_instances: Sequence[InstanceView] = ()) -> RouteDecision:
        """Where ``request`` goes; ``instances`` must not be empty."""


def check_instances(router: str, instances: Sequence[InstanceView]) -> None:
    if not instances:
        raise ValueError(f"router {router}: no instance to route to")


def most_free_decode(decode_instances: Sequence[InstanceView]) -> str | None:
    """LOADBALANCE(D): the decode instance with the most free KV blocks (ProServe §4.3)."""
    if not decode_instances:
        return None
    # max() keeps the first of equals: ties go to fewer decodes, then the lowest id.
    ordered = sorted(decode_instances, key=lambda v: v.id)
    return max(ordered, key=lambda v: (v.free_kv_blocks, -v.decoding)).id
