"""What one layer of one prefill batch does: compute segments and blocking collectives.

The only module of the serving simulator that reads the model and compute
model (:mod:`laxflow.sim.models`). Called by the simulator when a batch
starts (one plan per batch: layers are identical, so one plan serves all of
them) and by :mod:`.slo` for a request alone.

A layer is a sequence of segments run back to back on the unit's GPUs:

* sequence parallelism: the SP exchange (ring attention's KV ring) blocks
  attention, so it comes first;
* the attention side of the layer (QKV, attention, output projection,
  router, a dense or shared MLP);
* expert parallelism: MoE dispatch, the routed experts, MoE combine;
* tensor parallelism only where a TP group spans servers: a ring all-reduce
  after the layer (inside a server TP rides NVSwitch and is not simulated).

Placement follows ``laxflow.sim.models``: routing is uniform over the
unit's experts; dispatch/combine are hierarchical (once per token and remote
server, then NVSwitch) or, for ``ep_comm="allgather"`` deployments, a ring
all-gather / reduce-scatter over the unit. SP rings join the GPUs of an
attention group with the same TP rank, TP groups are contiguous. A request
runs on one attention-DP rank (``tp x sp`` GPUs; each rank batches its own
requests, the simulator picks the rank at arrival) and its KV lives there,
each KV head's shard on its TP rank, tokens split over SP ranks, so stage-1
and stage-3 flows move between those GPUs only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from laxflow.sim.serving.cluster import Cluster, Pattern, Unit


@dataclass(frozen=True)
class Segment:
    """One step of a layer: compute for ``seconds``, or a collective of ``per_gpu_bytes``."""

    kind: str  # "compute" or "collective"
    seconds: float = 0.0
    name: str = ""  # collective: "ep-dispatch", "ep-combine", "sp", "tp"
    pattern: Pattern | None = None
    per_gpu_bytes: float = 0.0

    @property
    def network_bytes(self) -> float:
        return self.per_gpu_bytes * self.pattern.net_bytes if self.pattern is not None else 0.0


@dataclass(frozen=True)
class LayerPlan:
    segments: tuple[Segment, ...]
    compute: float  # s, compute of one layer (all compute segments)

    def compute_after(self, k: int) -> float:
        """Compute left in the layer after segment ``k``."""
        return sum(s.seconds for s in self.segments[k + 1 :] if s.kind == "compute")

    def idle_cct(self, nvswitch_bytes_per_s: float) -> float:
        """Seconds of one layer's blocking collectives alone on an idle fabric.

        Each takes the longer of its network part at its group's idle
        bottleneck rate and its NVSwitch part, as ``BatchRun`` runs them.
        """
        total = 0.0
        for seg in self.segments:
            if seg.kind == "collective":
                net = seg.network_bytes / seg.pattern.bottleneck if seg.network_bytes > 0 else 0.0
                total += max(net, seg.per_gpu_bytes * seg.pattern.intra_bytes / nvswitch_bytes_per_s)
        return total


class ModelRunner:
    """The model and deployment of every unit, as the simulator needs them."""

    def __init__(self, model_name: str, deployment: str | Any | None, ep_comm: str | None = None,
                 comm_share: float | None = None) -> None:
        """``deployment``: a catalog name (None: the model's own) or a ``models.Deployment`` given as data
        (``ServingConfig.deployment`` set by ``laxflow sim map``'s axes and ``--config``). ``ep_comm`` and
        ``comm_share``: the physics of ``ServingConfig`` of the same names (None: the deployment's exchange,
        the roofline's compute)."""
        from laxflow.errors import UserError
        from laxflow.sim import models

        self._models = models
        self.model = models.get_model(model_name)
        self.deployment = (deployment if isinstance(deployment, models.Deployment)
                           else models.get_deployment(deployment or model_name))
        if self.deployment.model != self.model.name:
            raise UserError(
                f"deployment {self.deployment.name!r} is for model {self.deployment.model!r}, not {self.model.name!r}"
            )
        if ep_comm is not None and ep_comm != self.deployment.ep_comm:
            self.deployment = replace(self.deployment, ep_comm=ep_comm, name=f"{self.deployment.name}/{ep_comm}")
        self.comm_share = comm_share
        d = self.deployment
        self.num_layers = int(self.model.num_layers)
        self.tp, self.ep, self.sp = int(d.tp), int(d.ep), int(d.sp)
        self.attn_dp = int(d.attn_dp)
        # What moving one token's KV of one layer puts on the wire: every TP
        # rank's shard (heads are replicated when tp > num_kv_heads).
        self.kv_transfer_bytes_per_token_per_layer = float(d.kv_shard_bytes_per_token_per_layer(self.model) * self.tp)

    @property
    def unit_gpus(self) -> int:
        return int(self.deployment.gpus)

    def kv_gpus(self, unit: Unit, rank: int) -> tuple[int, ...]:
        """The GPUs of ``unit``'s attention-DP rank ``rank`` (where a request running there keeps its KV)."""
        size = self.tp * self.sp
        group = rank % max(1, len(unit.gpus) // size)
        return unit.gpus[group * size : (group + 1) * size]

    def plan(self, cluster: Cluster, unit: Unit, new_tokens: Sequence[int], context_tokens: Sequence[int],
             ranks: Sequence[int] | None = None) -> LayerPlan:
        """The layer plan of a batch: ``new_tokens[i]`` computed on attention-DP rank ``ranks[i]`` (None:
        spread longest-first), attending to ``context_tokens[i]`` (reuse + new)."""
        m, d = self._models, self.deployment
        t = m.layer_compute_breakdown(self.model, d, list(new_tokens), list(context_tokens),
                                      None if ranks is None else [r % self.attn_dp for r in ranks])
        traffic = m.collective_bytes_per_layer(self.model, d, int(sum(new_tokens)), int(sum(context_tokens)))
        gpus = len(unit.gpus)
        segs: list[Segment] = []
        if self.sp > 1 and traffic.sp_bytes > 0:
            size = self.tp * self.sp
            groups = [[a * size + r * self.tp + k for r in range(self.sp)] for a in range(gpus // size) for k in range(self.tp)]
            segs.append(self._coll(cluster, unit, "sp", "ring", groups, traffic.sp_bytes))
        if self.ep > 1 and traffic.ep_dispatch_bytes + traffic.ep_combine_bytes > 0:
            per_gpu = float(traffic.ep_dispatch_bytes)
            if d.ep_comm == "allgather":
                # NCCL runs one ring per channel and spreads the channels over the NICs: ring c
                # enters and leaves each server at its c-th GPU, so every NIC carries 1/rings.
                rings = self._nccl_rings(cluster, unit)
                pattern = cluster.collective(unit, "ring", rings)
                per_gpu /= len(rings)
            elif d.ep_comm == "pairwise":
                pattern = cluster.collective(unit, "uniform", [list(range(gpus))])
            else:
                gps = int(cluster.config.gpus_per_server)
                hits = m.ep_node_hits(self.model, d, gps)
                fanout = self.model.top_k * d.expert_tp * (1.0 - 1.0 / min(gps, gpus))
                pattern = cluster.ep_hierarchical(unit, tuple(hits), fanout)
            segs.append(Segment("compute", t.total - t.experts))
            segs.append(Segment("collective", name="ep-dispatch", pattern=pattern, per_gpu_bytes=per_gpu))
            segs.append(Segment("compute", t.experts))
            segs.append(Segment("collective", name="ep-combine", pattern=pattern, per_gpu_bytes=per_gpu))
        else:
            segs.append(Segment("compute", t.total))
        if self.tp > cluster.config.gpus_per_server and traffic.tp_bytes > 0:
            groups = [list(range(i, i + self.tp)) for i in range(0, gpus - self.tp + 1, self.tp)]
            segs.append(self._coll(cluster, unit, "tp", "ring", groups, traffic.tp_bytes))
        segs = [s for s in segs if not (s.kind == "compute" and s.seconds <= 0)]
        plan = LayerPlan(tuple(segs), float(t.total))
        return plan if self.comm_share is None else self._with_comm_share(plan, cluster)

    def _with_comm_share(self, plan: LayerPlan, cluster: Cluster) -> LayerPlan:
        """``plan`` with its compute scaled so that its blocking collectives, alone on an idle fabric, are
        ``comm_share`` of the layer (``ServingConfig.comm_share``: the MFS paper's profiled share, in place
        of the roofline's); a layer without collectives keeps its compute."""
        cct = plan.idle_cct(cluster.config.nvswitch_bytes_per_s)
        if cct <= 0 or plan.compute <= 0:
            return plan
        scale = cct * (1.0 - self.comm_share) / (self.comm_share * plan.compute)
        segs = tuple(replace(s, seconds=s.seconds * scale) if s.kind == "compute" else s for s in plan.segments)
        return LayerPlan(segs, plan.compute * scale)

    @staticmethod
    def _nccl_rings(cluster: Cluster, unit: Unit) -> list[list[int]]:
        """One ring over the unit per GPU of a server (positions in ``unit.gpus``), rotated so that ring c
        crosses between servers at each server's c-th GPU."""
        servers: dict[int, list[int]] = {}
        for pos, g in enumerate(unit.gpus):
            servers.setdefault(cluster.server_of(g), []).append(pos)
        nodes = [servers[k] for k in sorted(servers)]
        width = max(len(n) for n in nodes)
        return [[n[(c + 1 + i) % len(n)] for n in nodes for i in range(len(n))] for c in range(width)]

    def _coll(self, cluster: Cluster, unit: Unit, name: str, kind: str, groups: list[list[int]], nbytes: float) -> Segment:
        return Segment("collective", name=name, pattern=cluster.collective(unit, kind, groups), per_gpu_bytes=float(nbytes))
