"""Typed configuration of one serving simulation.

Built by the CLI (``laxflow sim serve``), by presets (:mod:`.experiment`) and
by tests; validated once here, with messages that name the field and what was
expected. Nothing downstream re-checks or clamps a value.

Units: bandwidths in Gbit/s (as a user says them), times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from laxflow.errors import UserError
from laxflow.sim.models.spec import EP_COMMS

TOPOLOGIES = ("fat-tree", "big-switch", "testbed")
# Where reusable KV lives (stage 1). "pool": a block lives only on the unit
# that first computed it (a Mooncake-style store spread over the prefill
# units); any other unit that reuses it fetches it remotely and does not keep
# a copy, so hot prefixes make "victim units" (MFS paper §2.2). The paper's
# setting and the default. "local-cache": every unit that fetched a block
# caches it too (vLLM-style per-instance prefix caching), so hot prefixes are
# copied everywhere and fetches are rare.
KV_PLACEMENTS = ("pool", "local-cache")
# How links are shared among the flow groups crossing them (ClusterConfig.fairness; cluster.py):
# "qp": per queue pair, as RDMA congestion control shares a link (a group of P point-to-point flows
# there gets P shares); "group": per flow group (a collective or a KV transfer counts once at its
# busiest link), the MFS paper's fair-sharing baseline (§6.3 "Baselines", Fig. 6b).
FAIRNESS = ("qp", "group")
# When a prompt's KV blocks become reusable by later requests (ServingConfig.reuse_from): "stored",
# when its prefill's compute ends and its unit stores them; "routed", from its arrival, so the
# workload's own reuse ratio is realized whatever the load (the MFS paper's §6.1/§6.3 workloads).
REUSE_FROM = ("stored", "routed")
# What a request does on its decode unit after its last P2D byte (ServingConfig.decode): "steps" (the
# default), the decode units are decode instances of the instance engine (instances/decode.py:
# continuous batches, KV memory, recompute preemption) and every output token is timed (TPOT, TBT);
# "hold", it holds the unit's load (for the router) output_tokens x decode_seconds_per_token and no
# decode is run (the MFS paper's simulator, which stops at the first token; bench/sim.py's timing).
DECODES = ("hold", "steps")
# The modeling choices where laxflow's faithful simulator and the MFS paper differ (README / results
# "why they differ"), as ServingConfig field values; ``--physics NAME`` sets them all, each field
# (``--ep-comm``, ``--fairness``, ``--comm-share``, ``--reuse-from``) can also be set on its own.
# "paper": pair-wise EP dispatch (§6.1/§6.3 simulator, top-k dispatch per token); fair sharing per
# flow group (§6.3 "Baselines"); compute set so the collectives are 60 % of an idle layer (§2.2:
# collectives are "40-60 % of end-to-end latency"; Fig. 5: CCT 1.8x under contention gives TTFT
# about +50 %, so about 0.5 / 0.8 = 0.62 of it was collective); the workload's reuse realized (§6.1).
PHYSICS: dict[str, dict[str, Any]] = {
    "faithful": {"ep_comm": None, "fairness": "qp", "comm_share": None, "reuse_from": "stored"},
    "paper": {"ep_comm": "pairwise", "fairness": "group", "comm_share": 0.6, "reuse_from": "routed"},
}


def parse_physics(spec: str) -> dict[str, Any]:
    """The four physics values of ``spec``: a name of PHYSICS, or ``field=value[;field=value]`` over
    "faithful" (``comm_share=0.6;reuse_from=routed``: one choice at a time, for ablations); one UserError.
    The values are checked where they are used (``ServingConfig`` / ``ClusterConfig``)."""
    if spec in PHYSICS:
        return dict(PHYSICS[spec])
    values = dict(PHYSICS["faithful"])
    for part in (p.strip() for p in str(spec).split(";")):
        key, eq, text = part.partition("=")
        if not eq or key not in values:
            raise UserError(f"physics: unknown {spec!r} (expected one of {', '.join(PHYSICS)}, or field=value;... "
                            f"with fields {', '.join(values)})")
        if key == "comm_share":
            try:
                values[key] = None if text == "none" else float(text)
            except ValueError:
                raise UserError(f"physics: comm_share: expected a number or none, got {text!r}") from None
        else:
            values[key] = None if key == "ep_comm" and text == "none" else text
    return values


def physics_name(values: dict[str, Any]) -> str:
    """The name of the PHYSICS entry ``values`` match, else their differences from "faithful" as
    ``field=value;...`` (what :func:`parse_physics` reads back)."""
    for name, known in PHYSICS.items():
        if known == values:
            return name
    base = PHYSICS["faithful"]
    return ";".join(f"{k}={'none' if v is None else v}" for k, v in values.items() if v != base[k])


@dataclass
class ClusterConfig:
    """Servers, GPUs, NICs and the fabric between them.

    One NIC per GPU (NIC i belongs to GPU i). The first ``prefill_servers``
    servers hold prefill units, the rest decode units (paper default: 1:1).
    ``gpus_per_server``, ``nic_gbps`` and ``nvswitch_gbps`` left at None take
    the model deployment's node (``laxflow.sim.models.Deployment``).
    """

    servers: int = 256
    gpus_per_server: int | None = None
    nic_gbps: float | None = None  # per NIC
    topology: str = "fat-tree"  # one of TOPOLOGIES
    nics_per_leaf: int = 32  # fat-tree only: NICs under one leaf switch
    oversubscription: float = 1.0  # fat-tree only: 1.0 is a 1:1 (non-blocking) fat-tree
    prefill_fraction: float = 0.5  # share of servers that run prefill
    nvswitch_gbps: float | None = None  # per GPU intra-node fabric (NVSwitch: 900 GB/s = 7200), not shared with the network
    decode_unit_gpus: int | None = None  # GPUs per decode unit; None: as many as a prefill unit
    fairness: str = "qp"  # one of FAIRNESS (see there): how a link is shared among the flow groups crossing it

    def __post_init__(self) -> None:
        self.validate()

    def resolve(self, gpus_per_server: int, nic_gbps: float, nvswitch_gbps: float) -> "ClusterConfig":
        """A copy with the unset node fields taken from the deployment."""
        return replace(
            self,
            gpus_per_server=self.gpus_per_server or gpus_per_server,
            nic_gbps=self.nic_gbps or nic_gbps,
            nvswitch_gbps=self.nvswitch_gbps or nvswitch_gbps,
        )

    def validate(self) -> None:
        _positive_int("servers", self.servers)
        _positive_int("nics_per_leaf", self.nics_per_leaf)
        for name in ("gpus_per_server", "nic_gbps", "nvswitch_gbps"):
            if getattr(self, name) is not None:
                (_positive_int if name == "gpus_per_server" else _positive_float)(name, getattr(self, name))
        _positive_float("oversubscription", self.oversubscription)
        if self.topology not in TOPOLOGIES:
            raise UserError(f"cluster.topology: unknown {self.topology!r} (expected one of {', '.join(TOPOLOGIES)})")
        if not 0.0 < self.prefill_fraction < 1.0:
            raise UserError(f"cluster.prefill_fraction: expected a number in (0, 1), got {self.prefill_fraction!r}")
        if self.servers < 2:
            raise UserError(f"cluster.servers: need at least 2 (one prefill, one decode), got {self.servers}")
        if self.decode_unit_gpus is not None:
            _positive_int("decode_unit_gpus", self.decode_unit_gpus)
        if self.fairness not in FAIRNESS:
            raise UserError(f"cluster.fairness: unknown {self.fairness!r} (expected one of {', '.join(FAIRNESS)})")

    @property
    def prefill_servers(self) -> int:
        return min(self.servers - 1, max(1, round(self.servers * self.prefill_fraction)))

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * 1e9 / 8

    @property
    def nvswitch_bytes_per_s(self) -> float:
        return self.nvswitch_gbps * 1e9 / 8


@dataclass
class ServingConfig:
    """Everything one run of the serving simulator needs besides the requests and the policy."""

    model: str = "mixtral-8x22b"
    # None: the model's paper deployment; a catalog name; or a ``laxflow.sim.models.Deployment`` given as
    # data (``laxflow sim map``: its NIC / EP axes and a user's --config), used as it is.
    deployment: Any = None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Max new (computed) tokens per batch of ONE attention-DP rank: each rank
    # forms its own batch, as DP-attention engines do (SGLang --dp-size, vLLM
    # DP+EP: max_num_batched_tokens is per engine); the unit's ranks step together.
    token_budget: int = 8192
    # None: each prefill unit runs the fcfs prefill scheduler (run-to-end batches per attention-DP rank). A name of
    # laxflow.integrations.prefill (flowprefill, fcfs, edf-cp2k, ...): that
    # scheduler drives each unit with preemption (serving/prefill_driver.py).
    prefill: str | None = None
    # With ``prefill``: the flow policy's pruned set (MFS) reaches the prefill scheduler, which defers
    # pruned tasks instead of computing them (mfs+flowprefill). False: the two run side by side, blind.
    prefill_coupling: bool = True
    # How the router picks a prefill unit: "load" (prefix overlap + queued tokens, Dynamo-style) or
    # "ttft" (network-inclusive TTFT estimate, as the hooks' dispatch_advice: queue + compute + P2D
    # bytes over the unit's NIC at its measured load, laxflow.hooks.api.estimate_ttft).
    router_dispatch: str = "load"
    slo_scale: float = 3.0  # SLO = slo_scale x the request's TTFT alone on the idle cluster
    warmup: int = 512  # first requests (by arrival) left out of the metrics
    # Stage 1: issue the reuse fetch of layer j at batch start (None: every
    # layer at once, as the MFS paper describes) or at most this many layers
    # ahead of the layer computing now.
    reuse_lookahead: int | None = None
    cache_tokens_per_unit: int = 1 << 20  # prefix-cache capacity of one prefill unit (LRU), in tokens
    router_overlap_weight: float = 1.0  # weight of non-cached prefix blocks against queued blocks (Dynamo's default)
    decode_seconds_per_token: float = 0.03  # decode "hold": how long a request holds its decode unit per output token
    decode: str = "steps"  # one of DECODES
    # Each request's TPOT SLO in seconds (both engines): None, the workload's (the SLO workloads have
    # one; the MFS workloads none, so the unit engine then reports TPOT without attainments).
    tpot_slo: float | None = None
    kv_placement: str = "pool"  # one of KV_PLACEMENTS (see there)
    # None: the router trades prefix overlap against load. A share in [0, 1]: that share of requests
    # with a cached prefix go to the least-loaded unit that does not hold most of it (their reuse is
    # fetched remotely), the rest to that holder (router.GlobalRouter._steer; laxflow sim map --remote-reuse).
    remote_reuse: float | None = None
    # Physics (PHYSICS above): None, the deployment's MoE exchange, or one of models.spec.EP_COMMS for
    # every MoE unit; None, the roofline's compute, or the share in (0, 1) of an idle layer its blocking
    # collectives take (compute scaled to match, plan.ModelRunner); and when KV becomes reusable (REUSE_FROM).
    ep_comm: str | None = None
    comm_share: float | None = None
    reuse_from: str = "stored"

    def __post_init__(self) -> None:
        self.validate()

    def with_physics(self, spec: str) -> "ServingConfig":
        """A copy with the four physics fields of ``spec`` set (:func:`parse_physics`: ``--physics``)."""
        values = parse_physics(spec)
        fairness = values.pop("fairness")
        return replace(self, cluster=replace(self.cluster, fairness=fairness), **values)

    @property
    def physics_values(self) -> dict[str, Any]:
        return {"ep_comm": self.ep_comm, "fairness": self.cluster.fairness, "comm_share": self.comm_share,
                "reuse_from": self.reuse_from}

    @property
    def physics(self) -> str:
        """The name of the PHYSICS entry these fields match, else ``field=value;...`` (:func:`physics_name`)."""
        return physics_name(self.physics_values)

    def validate(self) -> None:
        """Raise UserError naming the first bad field; runs on construction (and ``replace``)."""
        if not isinstance(self.cluster, ClusterConfig):
            raise UserError(f"cluster: expected a ClusterConfig, got {type(self.cluster).__name__}")
        self.cluster.validate()
        if self.kv_placement not in KV_PLACEMENTS:
            raise UserError(f"kv_placement: unknown {self.kv_placement!r} (expected one of {', '.join(KV_PLACEMENTS)})")
        _positive_int("token_budget", self.token_budget)
        _positive_float("slo_scale", self.slo_scale)
        _positive_int("cache_tokens_per_unit", self.cache_tokens_per_unit)
        if self.warmup < 0 or int(self.warmup) != self.warmup:
            raise UserError(f"warmup: expected an integer >= 0, got {self.warmup!r}")
        if self.reuse_lookahead is not None:
            _positive_int("reuse_lookahead", self.reuse_lookahead)
        if self.remote_reuse is not None and (isinstance(self.remote_reuse, bool) or not isinstance(
                self.remote_reuse, (int, float)) or not 0.0 <= self.remote_reuse <= 1.0):
            raise UserError(f"remote_reuse: expected None or a share in [0, 1], got {self.remote_reuse!r}")
        if self.ep_comm is not None and self.ep_comm not in EP_COMMS:
            raise UserError(f"ep_comm: unknown {self.ep_comm!r} (expected one of {', '.join(EP_COMMS)})")
        if self.comm_share is not None and (isinstance(self.comm_share, bool) or not isinstance(
                self.comm_share, (int, float)) or not 0.0 < self.comm_share < 1.0):
            raise UserError(f"comm_share: expected None or a share in (0, 1), got {self.comm_share!r}")
        if self.reuse_from not in REUSE_FROM:
            raise UserError(f"reuse_from: unknown {self.reuse_from!r} (expected one of {', '.join(REUSE_FROM)})")
        if self.router_overlap_weight < 0:
            raise UserError(f"router_overlap_weight: expected >= 0, got {self.router_overlap_weight!r}")
        if self.tpot_slo is not None:
            _positive_float("tpot_slo", self.tpot_slo)
        if self.decode not in DECODES:
            raise UserError(f"decode: unknown {self.decode!r} (expected one of {', '.join(DECODES)})")
        if self.decode_seconds_per_token < 0:
            raise UserError(f"decode_seconds_per_token: expected >= 0, got {self.decode_seconds_per_token!r}")
        if self.router_dispatch not in ("load", "ttft"):
            raise UserError(f"router_dispatch: expected 'load' or 'ttft', got {self.router_dispatch!r}")
        if self.prefill is not None:
            from laxflow.integrations.prefill import registry

            if self.prefill not in registry.prefill_scheduler_names():
                raise UserError(f"prefill: unknown {self.prefill!r} (expected one of "
                                f"{', '.join(registry.prefill_scheduler_names())})")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name}: expected a positive integer, got {value!r}")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise UserError(f"{name}: expected a positive number, got {value!r}")
