"""The Arrow paper's two systems baselines (paper 002 §7.1) as pool managers: ``vllm`` and ``vllm-disagg``.

They differ from ``static-pd`` / ``round-robin`` first in the SHAPE of the
cluster, not in dispatch: the paper runs them on the same 8 GPUs as Arrow,
but as fewer, wider instances.

* ``vllm`` -- "vLLM with tensor parallelism 8": ONE PD-colocated instance
  over every GPU of the run (TP = all GPUs), chunked prefill, decode first
  (vLLM's default scheduler; the simulator's ``sarathi``). Every request
  prefills and decodes there. As a pool manager over several colocated
  instances it balances by outstanding requests (vLLM-style request-count
  balancing) and decodes where it prefilled; with the one instance the
  shape gives it there is no choice to make.
* ``vllm-disagg`` -- "vLLM v0.7.3 disaggregated prefill": ONE prefill and
  ONE decode instance (v0.7.3 supports only 1P1D), each over half the GPUs
  (TP 4 + TP 4 on 8 GPUs); every prompt's KV goes from the prefill to the
  decode instance. Dispatch is ``static-pd``'s with one instance per pool.

``SHAPE`` names how the simulator reshapes the run's instances for each
(``laxflow.sim.serving.instances.pools.reshape_config``); the managers
themselves stay pure like every other pool manager.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from laxflow.integrations.prefill.iteration import build_config
from laxflow.integrations.pools.arrow import ArrowConfig
from laxflow.integrations.pools.base import ClusterSnapshot, PoolDecision, PoolManager, PoolRequest
from laxflow.integrations.pools.static_pd import StaticPd


class VllmColocated(PoolManager):
    """Every instance prefills and decodes; a request goes to the one with the fewest outstanding requests."""

    name = "vllm"
    shape: ClassVar[str] = "one-tp-instance"  # one colocated instance over all GPUs
    colocated: ClassVar[bool] = True

    @classmethod
    def from_profile(cls, samples: Sequence[tuple[float, float]], **options: Any) -> "VllmColocated":
        build_config(ArrowConfig, options)  # one option set for every pool manager; unused here
        return cls()

    def dispatch_prefill(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        if not snapshot.instances:
            raise ValueError("vllm: the cluster snapshot has no instance")
        # vLLM's data-parallel front end balances by request counts (waiting + running).
        best = min(snapshot.instances, key=lambda i: (len(i.queued_prefill_tokens) + i.decoding, i.id))
        return PoolDecision(best.id)

    def dispatch_decode(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        if request.prefill_instance is None:
            raise ValueError(f"vllm: request {request.id} has no prefill instance to decode on")
        return PoolDecision(request.prefill_instance)  # colocated: the KV never moves


class VllmDisaggregated(StaticPd):
    """vLLM v0.7.3's disaggregated prefill: fixed 1P1D (each half the GPUs); static-pd's dispatch."""

    name = "vllm-disagg"
    shape: ClassVar[str] = "two-tp-instances"  # one prefill + one decode instance, half the GPUs each
