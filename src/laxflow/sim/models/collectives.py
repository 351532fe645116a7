"""Bytes of the stage-2 collectives one layer of a prefill batch puts on the network.

Called by the serving simulator when a layer starts, to size the collective
flow groups it hands to the network engine. All byte counts are per GPU: what
each GPU of the replica SENDS in that collective (it receives as much on
average), local part included; the ``*_remote_fraction`` and
``*_inter_node_fraction`` fields say how much of it leaves the GPU and how
much leaves the node (only the latter crosses a NIC). Formulas, with T the
batch's new tokens, C its context tokens (reused prefix + new), b bytes per
element, H hidden, k top_k, G GPUs of the replica:

EP (MoE, once per layer each way), by the deployment's ``ep_comm``:
  * ``hierarchical`` (DeepEP's internode kernels, Megatron's all-to-all then
    all-gather inside the expert-TP group): a token crosses the network once
    per (token, remote node) that hosts one of its top-k experts, to the GPU
    of the same local rank there, which fans it out over NVSwitch to every
    GPU of every hit expert's TP group; combine reduces inside the node first
    and returns once per (token, node). Tokens are spread evenly over the
    G GPUs, so each GPU dispatches ``ep_dispatch_bytes = T H b / G`` of
    hidden vectors and sends ``hit(n)`` of them to node n, where, with
    routing uniform over the E experts and e_n of them on node n,
    ``hit(n) = 1 - C(E - e_n, k) / C(E, k)`` (``ep_node_hits``). Inter-node
    bytes per token and direction: H b * sum over the other nodes of hit(n).
  * ``allgather`` (vLLM's default DP+EP backend ``allgather_reducescatter``,
    what a PCIe testbed without DeepEP runs): dispatch all-gathers every
    token to every GPU, combine reduce-scatters the outputs; NCCL runs both
    as rings, so each GPU sends ``(G - 1)/G T H b`` to its ring successor.
  * ``pairwise`` (a flat all-to-all, NCCL send/recv per GPU pair without
    node-level aggregation: the MFS paper's EP traffic, whose simulator sizes
    a token's dispatch by its top-k experts, §6.1/§6.3): each of a GPU's
    ``T/G`` tokens goes to every GPU of each of its k experts' groups, so the
    GPU sends ``k expert_tp T H b / G``, spread evenly over the G GPUs (the
    share for itself stays); combine returns as much.
  ``ep_remote_fraction`` and ``ep_inter_node_fraction`` are the shares of
  the per-GPU payload that leave the GPU and that cross a NIC (the latter may
  exceed 1 for ``hierarchical``: one vector can go to several nodes).

SP (ring attention, pass-KV: Yang et al. 2024 "Context parallelism for
  scalable million-token inference"): each GPU forwards the KV shard of every
  other SP rank around the ring, for the whole context including the reused
  prefix:  sp_bytes = (sp - 1)/sp * C * kv_shard, kv_shard = the GPU's TP
  share of one token's K and V. Ring hops cross nodes where consecutive SP
  ranks sit on different nodes.

TP (ring all-reduce of the attention group's activations): 2 (tp - 1)/tp *
  (T / (attn_dp sp)) H b per all-reduce; dense models do two per layer
  (after attention and after the MLP), MoE models one (after attention; the
  expert outputs come back through combine) plus one for a shared MLP. TP
  groups are contiguous, so TP crosses nodes only when tp > gpus_per_node.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from laxflow.sim.models.spec import Deployment, ModelSpec


@dataclass(frozen=True)
class CollectiveTraffic:
    """Per-GPU bytes sent in one layer's collectives, and which share crosses what."""

    ep_dispatch_bytes: float = 0.0
    ep_combine_bytes: float = 0.0
    sp_bytes: float = 0.0
    tp_bytes: float = 0.0
    ep_remote_fraction: float = 0.0
    ep_inter_node_fraction: float = 0.0
    ep_comm: str = "hierarchical"  # the deployment's EP exchange (see module docstring)
    sp_inter_node_fraction: float = 0.0
    tp_inter_node_fraction: float = 0.0

    @property
    def inter_node_bytes(self) -> float:
        """Per-GPU bytes that leave the node (go through the GPU's NIC) in this layer."""
        return ((self.ep_dispatch_bytes + self.ep_combine_bytes) * self.ep_inter_node_fraction
                + self.sp_bytes * self.sp_inter_node_fraction
                + self.tp_bytes * self.tp_inter_node_fraction)


def _ring_inter_node_fraction(ranks: int, stride: int, dep: Deployment) -> float:
    """Share of ring hops rank r -> r+1 (GPU r*stride) that change node."""
    if ranks <= 1:
        return 0.0
    crossing = sum(dep.node_of(r * stride) != dep.node_of(((r + 1) % ranks) * stride) for r in range(ranks))
    return crossing / ranks


def ep_node_hits(model: ModelSpec, dep: Deployment, gpus_per_node: int | None = None) -> list[float]:
    """Per node of the replica: probability that a token's top-k experts touch it (uniform routing).

    Expert group i (``dep.expert_tp`` consecutive GPUs) holds experts
    ``i E/ep .. (i+1) E/ep - 1``; an expert counts for every node its group
    has a GPU on. ``gpus_per_node`` defaults to the deployment's.
    """
    g = dep.gpus
    per_node = gpus_per_node or dep.gpus_per_node
    e, k = model.num_experts, model.top_k
    per_group = e // dep.ep
    nodes = -(-g // per_node)
    experts_on = [set() for _ in range(nodes)]
    for group in range(dep.ep):
        for gpu in range(group * dep.expert_tp, (group + 1) * dep.expert_tp):
            experts_on[gpu // per_node].update(range(group * per_group, (group + 1) * per_group))
    total = comb(e, k)
    return [1.0 - comb(e - len(s), k) / total for s in experts_on]


def collective_bytes_per_layer(model: ModelSpec, dep: Deployment, batch_tokens: int,
                               context_tokens: int | None = None) -> CollectiveTraffic:
    """Stage-2 traffic of one layer for a batch of ``batch_tokens`` new tokens.

    ``context_tokens`` is the batch's total attention context (reused prefix +
    new tokens, summed over requests); it matters only for SP and defaults to
    ``batch_tokens`` (no reuse).
    """
    if batch_tokens < 0:
        raise ValueError(f"batch_tokens must be >= 0, got {batch_tokens}")
    ctx = batch_tokens if context_tokens is None else context_tokens
    if ctx < batch_tokens:
        raise ValueError(f"context_tokens ({ctx}) < batch_tokens ({batch_tokens})")
    b, h, g = model.dtype_bytes, model.hidden, dep.gpus
    local = min(g, dep.gpus_per_node)

    ep_bytes = ep_remote = ep_inter = 0.0
    if model.is_moe and g > 1:
        if dep.ep_comm == "allgather":
            ep_bytes = (g - 1) / g * batch_tokens * h * b
            ep_remote = 1.0
            ep_inter = _ring_inter_node_fraction(g, 1, dep)
        elif dep.ep_comm == "pairwise":
            ep_bytes = model.top_k * dep.expert_tp * batch_tokens * h * b / g
            ep_remote = (g - 1) / g
            ep_inter = (g - local) / g
        else:
            ep_bytes = batch_tokens * h * b / g
            hits = ep_node_hits(model, dep)
            ep_inter = sum(hits) - hits[0]  # from node 0; every node alike when nodes are full
            per_node = hits[0]  # the sender's own node: fan-out over NVSwitch
            ep_remote = ep_inter + per_node * (1.0 - 1.0 / local)

    sp_bytes = sp_inter = 0.0
    if dep.sp > 1:
        sp_bytes = (dep.sp - 1) / dep.sp * ctx * dep.kv_shard_bytes_per_token_per_layer(model)
        sp_inter = _ring_inter_node_fraction(dep.sp, dep.tp, dep)

    tp_bytes = tp_inter = 0.0
    if dep.tp > 1:
        per_group = batch_tokens / (dep.attn_dp * dep.sp) * h * b
        count = 1 + (1 if model.shared_ffn_hidden else 0) if model.is_moe else 2
        tp_bytes = count * 2 * (dep.tp - 1) / dep.tp * per_group
        tp_inter = _ring_inter_node_fraction(dep.tp, 1, dep)

    return CollectiveTraffic(ep_dispatch_bytes=ep_bytes, ep_combine_bytes=ep_bytes, sp_bytes=sp_bytes,
                             tp_bytes=tp_bytes, ep_remote_fraction=ep_remote, ep_inter_node_fraction=ep_inter,
                             ep_comm=dep.ep_comm,
                             sp_inter_node_fraction=sp_inter, tp_inter_node_fraction=tp_inter)
