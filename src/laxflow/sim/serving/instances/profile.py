"""Step time of one instance from laxflow's compute model, and its profile for the schedulers.

Called by :class:`.engine.InstanceEngine` when it builds the instances (once
per deployment: ``profile_samples`` is cached) and at every step (``StepTimer``).
A step runs every layer of the replica over the batch's entries: the same
roofline compute model (``laxflow.sim.models.compute``) the prefill units use,
where a decode entry is one new token attending to its whole context, so
decode steps are memory-bound on the weights and the KV they read. A TP>1
replica adds its per-layer all-reduces over NVLink (bandwidth term; the
papers' single-GPU instances have none).

The schedulers and routers never see the compute model: they fit their own
latency models (FairBatching's ``a + b*new + c*context``, ProServe's Eq. 4-7)
to ``profile_samples``, mixed steps sampled from it, as the papers fit theirs to
profiled forwards.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from laxflow.integrations.prefill.iteration import BatchSample
from laxflow.sim.models import get_deployment, get_model, layer_compute_time
from laxflow.sim.models.spec import weight_bytes_per_gpu


class StepTimer:
    """Seconds of one step of one replica of ``deployment``."""

    def __init__(self, deployment: Any) -> None:
        """``deployment``: a catalog name, or a ``models.Deployment`` given as data."""
        self.dep = get_deployment(deployment) if isinstance(deployment, str) else deployment
        self.model = get_model(self.dep.model)

    def seconds(self, entries: Sequence[tuple[int, int]]) -> float:
        """``entries``: (new tokens, KV context before them) per sequence in the batch."""
        if not entries:
            return 0.0
        news = [n for n, _ in entries]
        ctxs = [c + n for n, c in entries]  # the compute model's context includes the new tokens
        return self.model.num_layers * (layer_compute_time(self.model, self.dep, news, ctxs)
                                         + self.tp_allreduce_seconds(sum(news)))

    def tp_allreduce_seconds(self, tokens: int) -> float:
        """One layer's TP all-reduces (Megatron: after attention's output projection and after the
        FFN) of ``tokens`` activations, ring over the node's NVLink: 2 (tp-1)/tp x bytes / link.
        Bandwidth term only (no per-call latency: optimistic for wide TP). 0 at TP1."""
        tp = self.dep.tp
        if tp == 1 or tokens == 0 or self.dep.intra_node_gbps <= 0:  # no NVLink figure: not modelled
            return 0.0
        size = tokens * self.model.hidden * self.model.dtype_bytes
        return 2 * (2 * (tp - 1) / tp * size / (self.dep.intra_node_gbps * 1e9 / 8))

    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    def kv_capacity_tokens(self, gpu_memory_utilization: float) -> int:
        """vLLM's sizing: (device memory x utilization - weights) over KV bytes per token, all GPUs."""
        per_gpu = self.dep.gpu.mem_bytes * gpu_memory_utilization - weight_bytes_per_gpu(self.model, self.dep)
        return max(0, int(per_gpu * self.dep.gpus // self.model.kv_bytes_per_token))


@lru_cache(maxsize=16)
def profile_samples(deployment: str) -> tuple[BatchSample, ...]:
    """Mixed steps sampled from the compute model (decode-only, prefill-only, mixed), seeded."""
    timer = StepTimer(deployment)
    rng = np.random.default_rng(0)
    out: list[BatchSample] = []
    for k in range(96):
        decodes = int(rng.choice([0, 1, 4, 16, 64, 128, 256])) if k % 3 else 0
        prefills = int(rng.integers(0 if decodes else 1, 3))
        entries: list[tuple[int, int, bool]] = []
        for _ in range(decodes):
            entries.append((1, int(rng.integers(16, 4096)), False))
        for _ in range(prefills):
            entries.append((int(rng.choice([32, 128, 512, 1024, 2048, 4096])), int(rng.choice([0, 0, 512, 2048])), True))
        if not entries:
            entries.append((1, 512, False))
        secs = timer.seconds([(n, c) for n, c, _ in entries])
        out.append(BatchSample(tuple(entries), secs))
    return tuple(out)
