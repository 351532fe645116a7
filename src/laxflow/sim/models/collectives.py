"""Bytes of the stage-2 collectives one layer of a prefill batch puts on the network.

Called by the serving simulator when a layer starts, to size the collective
flow groups it hands to the network engine. All byte counts are per GPU: what
each GPU of the replica SENDS in that collective (it receives as much on
average), local part included; the ``*_remote_fraction`` and
``*_inter_node_fraction`` fields say how much of it leaves the GPU and how
much leaves the node (only the latter crosses a NIC). Formulas, with T the
batch's new tokens, C its context tokens (reused prefix + new), b bytes per
element, H hidden, k top_k, G GPUs of the replica:

EP (MoE, once per layer each way): every routed (token, expert) pair sends the
  token's hidden vector to each of the ``expert_tp`` GPUs that shard the
  expert (dispatch) and gets a partial output back from each (combine):
      ep_dispatch_bytes = ep_combine_bytes = T k H b expert_tp / G
  Routing is uniform, so a pair's destination is any of the G GPUs alike:
  remote fraction 1 - 1/G, inter-node fraction 1 - min(G, gpus_per_node)/G.

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
        ep_bytes = batch_tokens * model.top_k * h * b * dep.expert_tp / g
        ep_remote = 1.0 - 1.0 / g
        ep_inter = 1.0 - local / g

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
                             sp_inter_node_fraction=sp_inter, tp_inter_node_fraction=tp_inter)
