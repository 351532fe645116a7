"""Per-request TTFT SLO: ``slo_scale`` x the request's TTFT alone on the idle cluster.

The MFS paper sets the SLO to 3x "the TTFT measured under low load". We make
that per request and exact, and fix it from the workload alone before any
policy runs, so every policy is judged against the same SLO of each request
(routing, which depends on the policy's timing, does not enter): the request
alone on an idle cluster, on prefill unit 0's attention-DP rank 0 and decode
unit 0 (all units of one run are alike; only where the fabric is not uniform
could another unit differ), with the prefix it shares with any earlier
request of the workload already cached there (``workload_reuse``: the
leading run of its blocks seen before, as an unbounded prefix cache would
hold it), so there is no stage 1. Alone, the layers run back
to back; each blocking collective takes its flow group's bottleneck time (or
its NVSwitch time, whichever is longer); the P2D transfers of successive
layers queue behind one another on the prefill-to-decode path, each at the
path's bottleneck rate, overlapping the later layers' compute. TTFT alone is
the end of the last P2D transfer.

That is a closed form (one pass over the layers, cached by shape), so the SLO
of 1536 requests costs milliseconds instead of 1536 single-request
simulations. It ignores one effect a real run alone would have: a P2D
transfer sharing the prefill NICs with the next layer's all-to-all. The tests
check the simulator against this formula where nothing overlaps.
"""

from __future__ import annotations

from typing import Any, Sequence

from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.plan import LayerPlan, ModelRunner


def workload_reuse(requests: Sequence[Any]) -> list[int]:
    """Per request (in the given order): tokens of its leading blocks that an earlier request also had.

    Capped at ``input_tokens - 1`` (one token is always computed). Depends on
    the workload only, never on a policy.
    """
    seen: set[int] = set()
    out: list[int] = []
    for r in requests:
        hashes, block = list(r.block_hashes), int(r.block_size)
        n = 0
        for h in hashes:
            if h not in seen:
                break
            n += 1
        out.append(max(0, min(n * block, int(r.input_tokens) - 1)))
        seen.update(hashes)
    return out


def ttft_alone(plan: LayerPlan, num_layers: int, p2d_bytes_per_layer: float, p2d_net: float, p2d_rate: float,
               p2d_intra: float, nvswitch: float) -> float:
    """TTFT of one request alone, from its layer plan and its P2D path (see module docstring)."""
    layer = 0.0
    for seg in plan.segments:
        if seg.kind == "compute":
            layer += seg.seconds
        else:
            net = seg.network_bytes / seg.pattern.bottleneck if seg.network_bytes > 0 else 0.0
            layer += max(net, seg.per_gpu_bytes * seg.pattern.intra_bytes / nvswitch)
    per_p2d = max(
        p2d_bytes_per_layer * p2d_net / p2d_rate if p2d_net > 0 else 0.0,
        p2d_bytes_per_layer * p2d_intra / nvswitch,
    )
    t = 0.0
    p2d_free = 0.0
    for _ in range(num_layers):
        t += layer
        p2d_free = max(t, p2d_free) + per_p2d
    return max(t, p2d_free)


class SloModel:
    """Computes and caches idle-cluster TTFT per request shape. Called by the simulator at each arrival."""

    def __init__(self, runner: ModelRunner, cluster: Cluster, slo_scale: float) -> None:
        self.runner = runner
        self.cluster = cluster
        self.slo_scale = slo_scale
        self._cache: dict[tuple, float] = {}

    def idle_ttft(self, input_tokens: int, reused_tokens: int) -> float:
        """TTFT alone of a request of this size and cached prefix (see the module docstring)."""
        prefill, decode = self.cluster.prefill_units[0], self.cluster.decode_units[0]
        src, dst = self.runner.kv_gpus(prefill, 0), self.runner.kv_gpus(decode, 0)
        key = (input_tokens, reused_tokens)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        new = max(1, input_tokens - reused_tokens)
        plan = self.runner.plan(self.cluster, prefill, [new], [input_tokens], [0])
        pattern = self.cluster.transfer(src, dst)
        value = ttft_alone(
            plan,
            self.runner.num_layers,
            input_tokens * self.runner.kv_transfer_bytes_per_token_per_layer,
            pattern.net_bytes,
            pattern.bottleneck,
            pattern.intra_bytes,
            self.cluster.config.nvswitch_bytes_per_s,
        )
        self._cache[key] = value
        return value

    def slo(self, idle_ttft: float) -> float:
        return self.slo_scale * idle_ttft
