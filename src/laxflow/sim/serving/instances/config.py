"""Typed configuration of one iteration-level serving run (``laxflow.sim.serving.instances``).

Built by :mod:`.run` from a ``RunSpec`` (the CLI's ``--prefill/--router/--pools/--instances``)
and by tests; validated once here with messages naming the field and the choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from laxflow.errors import UserError
from laxflow.sim.serving.config import ClusterConfig

# Every policy runs with these; none is tuned to a workload or preset.
DEFAULT_DEPLOYMENT = "llama3-8b-tp1-a800"  # FairBatching's LLaMA3.1-8B on one A800 (its Table 1)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory for weights + KV
NETWORKS = ("fabric", "ideal")  # --network: transfers are flows (instances/fabric.py; default) or cost nothing
# Where the instances sit (instances/fabric.py): "ports" one server and one bonded port per instance on a big
# switch (the default, the engine's placement since step 2); "cluster" consecutive GPUs of ``cluster``'s servers
# on its topology, one NIC per GPU (fabric.instance_cluster).
PLACEMENTS = ("ports", "cluster")
# How a prompt's KV leaves a prefill instance: "prompt" one transfer after its last chunk (the default);
# "layer" each chunk's KV layer by layer as the step computes it (instances/layers.py).
P2D_MODES = ("prompt", "layer")


@dataclass
class InstanceSimConfig:
    """Instances, their local scheduler, the router and the SLOs of one run.

    ``prefill_instances`` None: every instance is PD-colocated (mixed batches);
    an integer: the first that many are prefill instances, the rest decode
    instances (P2D KV over the network). ``kv_tokens`` None: each instance's
    KV capacity is (GPU memory x utilization - weights) / KV bytes per token.
    """

    deployment: str = DEFAULT_DEPLOYMENT
    instances: int = 1
    prefill_instances: int | None = None
    scheduler: str = "sarathi"
    router: str = "dplb"
    pools: str | None = None  # a pool manager (laxflow.integrations.pools), plugged in by its dispatcher
    ttft_slo: float = 0.5
    tpot_slo: float = 0.05
    warmup: int = 0
    seed: int = 0
    kv_tokens: int | None = None
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    flow_policy: str = "fs"  # network policy of the P2D flows
    w_p: float | None = None  # TDG first-token weight; None: the ONE rule (mean input / mean output, w_d = 1)
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    router_options: dict[str, Any] = field(default_factory=dict)
    network: str = "fabric"  # --network: fabric (transfers are flows, instances/fabric.py) or ideal (free, instant)
    placement: str = "ports"  # one of PLACEMENTS: where the instances' GPUs sit (instances/fabric.py)
    cluster: ClusterConfig | None = None  # placement "cluster": servers, topology, NICs (None: ClusterConfig());
    # placement "ports" reads its nic_gbps only (None: the deployment's)
    p2d: str = "prompt"  # one of P2D_MODES: the KV of a prompt leaves whole after it, or per layer (layers.py)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def disaggregated(self) -> bool:
        return self.prefill_instances is not None

    @property
    def prefill_units(self) -> bool:
        """Whether ``scheduler`` is a prefill scheduler (``laxflow.integrations.prefill``: fcfs, flowprefill,
        edf-*): then every prefill instance is a prefill unit (``instances/unit.py``) running it."""
        from laxflow.integrations.prefill.registry import batch_scheduler_names, prefill_scheduler_names

        return self.scheduler not in batch_scheduler_names() and self.scheduler in prefill_scheduler_names()

    def validate(self) -> None:
        from laxflow.integrations.prefill.registry import batch_scheduler_names, prefill_scheduler_names
        from laxflow.integrations.routing.registry import router_names
        from laxflow.sim.models import DEPLOYMENTS

        if self.deployment not in DEPLOYMENTS:
            raise UserError(f"deployment: unknown {self.deployment!r} (expected one of {', '.join(DEPLOYMENTS)})")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) or self.instances < 1:
            raise UserError(f"--instances: expected a positive number of instances, got {self.instances!r}")
        if self.prefill_instances is not None and not 1 <= self.prefill_instances < self.instances:
            raise UserError(f"--instances: a disaggregated cluster needs at least one prefill and one decode "
                            f"instance, got {self.prefill_instances} prefill of {self.instances}")
        if self.scheduler not in batch_scheduler_names() and not self.prefill_units:
            raise UserError(f"--prefill: {self.scheduler!r} is neither an iteration-level batch scheduler "
                            f"({', '.join(batch_scheduler_names())}) nor a prefill scheduler "
                            f"({', '.join(prefill_scheduler_names())})")
        if self.prefill_units:
            check_prefill_units(self.scheduler, self.disaggregated, self.pools, self.placement, self.p2d)
        if self.scheduler == "fairbatching-pab" and (self.disaggregated or self.pools is not None):
            raise UserError("--prefill fairbatching-pab: admission by the prefill admission budget needs "
                            "PD-colocated instances (--instances N, no --pools), since the budget reserves the "
                            "instance's own decode steps")
        if self.network not in NETWORKS:
            raise UserError(f"--network: unknown {self.network!r} (expected one of {', '.join(NETWORKS)})")
        if self.placement not in PLACEMENTS:
            raise UserError(f"placement: unknown {self.placement!r} (expected one of {', '.join(PLACEMENTS)})")
        if self.cluster is not None and not isinstance(self.cluster, ClusterConfig):
            raise UserError(f"cluster: expected a ClusterConfig, got {type(self.cluster).__name__}")
        if self.p2d not in P2D_MODES:
            raise UserError(f"p2d: unknown {self.p2d!r} (expected one of {', '.join(P2D_MODES)})")
        if self.router not in router_names():
            raise UserError(f"--router: unknown {self.router!r} (expected one of {', '.join(router_names())})")
        for name in ("ttft_slo", "tpot_slo", "gpu_memory_utilization"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise UserError(f"{name}: expected a positive number, got {v!r}")
        if self.gpu_memory_utilization > 1:
            raise UserError(f"gpu_memory_utilization: expected at most 1, got {self.gpu_memory_utilization}")
        if self.kv_tokens is not None and (not isinstance(self.kv_tokens, int) or self.kv_tokens < 1):
            raise UserError(f"kv_tokens: expected a positive integer, got {self.kv_tokens!r}")
        if self.w_p is not None and not (math.isfinite(self.w_p) and self.w_p > 0):
            raise UserError(f"w_p: expected a positive number, got {self.w_p!r}")
        if self.warmup < 0:
            raise UserError(f"warmup: expected an integer >= 0, got {self.warmup!r}")


def check_prefill_units(scheduler: str, disaggregated: bool, pools: str | None, placement: str, p2d: str) -> None:
    """Raise UserError unless prefill scheduler ``scheduler`` can run the instance engine's prefill instances as
    prefill units (``instances/unit.py``) in this layout."""
    if not disaggregated or pools is not None:
        raise UserError(f"--prefill {scheduler}: a prefill scheduler runs prefill units, which only prefill: give "
                        f"--instances P:D (and no --pools: a unit cannot flip to decode)")
    if placement != "cluster" or p2d != "layer":
        raise UserError(f"--prefill {scheduler}: prefill units sit on the cluster's servers and send each layer's KV "
                        f"as it is computed (--placement cluster --p2d layer, their default), not --placement "
                        f"{placement} --p2d {p2d}")


def parse_instances(text: str) -> tuple[int, int | None]:
    """``--instances``: ``N`` (N colocated instances) or ``P:D`` (P prefill + D decode instances)."""
    try:
        if ":" in text:
            p, d = (int(x) for x in text.split(":"))
            if p < 1 or d < 1:
                raise ValueError
            return p + d, p
        n = int(text)
        if n < 1:
            raise ValueError
        return n, None
    except ValueError:
        raise UserError(f"--instances: expected N (colocated) or P:D (disaggregated, both >= 1), got {text!r}") \
            from None
