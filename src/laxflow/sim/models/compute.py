"""GPU time of one transformer layer for one prefill batch, from shapes and a roofline.

Called by the serving simulator each time a prefill unit starts a layer (or
once per batch, the layers being identical): given each request's new tokens
and its attention context (reused prefix + new tokens), it returns how long
the GPUs of ONE replica compute that layer. Communication is not included:
the stage-2 collectives between the operators are flows in the network engine
(sized by ``collectives.py``).

Model, per operator group, each a roofline ``max(flops / (peak * eff),
bytes / (mem_bw * mbu))`` on one GPU's share of the work:

  qkv       2 T H (q + 2 kv)                   weights + activations
  attention 4 heads head_dim * pairs           KV of the whole context read once
            pairs = sum_i n_i (c_i - n_i) + n_i (n_i + 1) / 2   (causal, with prefix)
  out_proj  2 T q H
  router    2 T H E   (replicated over TP)
  dense_ffn 6 T H F   (dense models; Grok-2's shared MLP)
  experts   6 (T top_k) H F over all GPUs;  weights of the local experts the
            batch touches: E/ep * (1 - (1 - top_k/E)^T) of them, 1/expert_tp each

Attention-side operators (qkv .. dense_ffn) run per attention group
(``tp x sp`` GPUs, work split evenly over them: TP splits heads and matmul
columns, SP splits tokens, ring attention keeps causal work balanced). When
``attn_dp > 1`` each request runs on one group: the caller says which
(``groups``: the serving simulator gives each attention-DP rank its own
batch, as DP-attention engines do) or, by default, the requests are spread
longest-first (``assign_attention_groups``); the layer waits for the slowest
group, since the expert all-to-all synchronizes them.
Experts assume uniform routing (no load imbalance). Norms, rotary and
residual adds are elementwise and left out (< 2 % of prefill time).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from laxflow.sim.models.spec import Deployment, ModelSpec


@dataclass(frozen=True)
class LayerTime:
    """One layer's time and where it goes (seconds). ``total`` is what the layer takes.

    The attention-side fields are those of the slowest attention group.
    """

    total: float
    qkv: float = 0.0
    attention: float = 0.0
    out_proj: float = 0.0
    router: float = 0.0
    dense_ffn: float = 0.0
    experts: float = 0.0


def attention_pairs(new_tokens: int, context_tokens: int) -> int:
    """Query-key pairs one request's new tokens attend to (causal, after a reused prefix): a whole number, so
    a batch's sum is exact in any order."""
    prefix = context_tokens - new_tokens
    return new_tokens * prefix + new_tokens * (new_tokens + 1) // 2


def _validate(new_tokens: Sequence[int], context_tokens: Sequence[int]) -> None:
    if len(new_tokens) != len(context_tokens):
        raise ValueError(f"new_tokens has {len(new_tokens)} entries, context_tokens {len(context_tokens)}")
    for i, (n, c) in enumerate(zip(new_tokens, context_tokens)):
        if n < 0 or c < n:
            raise ValueError(f"request {i}: expected 0 <= new_tokens <= context_tokens, got {n}, {c}")


def _group_parts(model: ModelSpec, dep: Deployment, t: int, pairs: int, ctx: int) -> tuple[float, ...]:
    """Attention-side operators of one ``tp x sp`` group running requests of ``t`` new tokens in all,
    ``pairs`` query-key pairs (``attention_pairs`` summed) and ``ctx`` context tokens:
    (total, qkv, attention, out_proj, router, dense_ffn), or (0.0,) for no tokens (LayerTime's order: one
    layer's parts for each group, the LayerTime only for the slowest)."""
    if t == 0:
        return (0.0,)
    gpu, b = dep.gpu, model.dtype_bytes
    tp, sp = dep.tp, dep.sp
    shard = tp * sp
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    t_gpu = t / sp  # tokens each GPU of the group holds activations for
    qkv = gpu.roofline(2 * t * h * (q + 2 * kv) / shard,
                       b * (h * (q + 2 * kv) / tp + t_gpu * (h + (q + 2 * kv) / tp)))
    attn = gpu.roofline(4 * model.num_heads * model.head_dim * float(pairs) / shard,
                        b * (ctx * 2 * kv / tp + 2 * t_gpu * q / tp), gpu.attn_eff)
    out = gpu.roofline(2 * t * q * h / shard, b * (q * h / tp + t_gpu * (q / tp + h)))
    router = 0.0
    if model.is_moe:
        e = model.num_experts
        router = gpu.roofline(2 * t_gpu * h * e, b * (h * e + t_gpu * (h + e)))
    f = model.shared_ffn_hidden if model.is_moe else model.ffn_hidden
    ffn = 0.0
    if f:
        ffn = gpu.roofline(6 * t * h * f / shard, b * (3 * h * f / tp + t_gpu * (2 * h + 3 * f / tp)))
    return qkv + attn + out + router + ffn, qkv, attn, out, router, ffn


def _expert_time(model: ModelSpec, dep: Deployment, tokens: int) -> float:
    """Routed experts on one GPU, uniform routing over ``ep`` groups of ``expert_tp`` GPUs."""
    if not model.is_moe or tokens == 0:
        return 0.0
    gpu, b = dep.gpu, model.dtype_bytes
    h, f, e, k = model.hidden, model.ffn_hidden, model.num_experts, model.top_k
    etp = dep.expert_tp
    pairs = tokens * k / dep.ep  # (token, expert) pairs landing on one expert group
    touched = e / dep.ep * (1.0 - (1.0 - k / e) ** tokens)
    return gpu.roofline(6 * h * f * pairs / etp,
                        b * (touched * 3 * h * f / etp + pairs * (2 * h + 3 * f / etp)))


def assign_attention_groups(model: ModelSpec, dep: Deployment, new_tokens: Sequence[int],
                            context_tokens: Sequence[int]) -> list[int]:
    """Attention group (0 .. attn_dp - 1) of each request: longest first onto the least loaded.

    The compute model runs each request's attention on the group given here;
    the serving simulator can place the request's KV (stage-1 and stage-3
    endpoints) on the same group. Ties go to the lowest group index, so the
    assignment is deterministic.
    """
    _validate(new_tokens, context_tokens)
    return _assign(model, dep, new_tokens, context_tokens)


def _assign(model: ModelSpec, dep: Deployment, new_tokens: Sequence[int], context_tokens: Sequence[int]) -> list[int]:
    """``assign_attention_groups`` of validated lengths."""
    if dep.attn_dp == 1:
        return [0] * len(new_tokens)
    per_token = 2 * model.hidden * (2 * model.q_dim + 2 * model.kv_dim) / dep.gpu.mfu
    per_pair = 4 * model.num_heads * model.head_dim / dep.gpu.attn_eff
    cost = [n * per_token + attention_pairs(n, c) * per_pair for n, c in zip(new_tokens, context_tokens)]
    order = sorted(range(len(cost)), key=cost.__getitem__, reverse=True)  # costliest first, ties by index (stable)
    heap = [(0.0, g) for g in range(dep.attn_dp)]
    where = [0] * len(cost)
    for i in order:  # (the least loaded group, lowest index on ties: (load, g) pairs are distinct)
        load, g = heap[0]
        where[i] = g
        heapq.heapreplace(heap, (load + cost[i], g))
    return where


def layer_compute_breakdown(model: ModelSpec, dep: Deployment, new_tokens: Sequence[int],
                            context_tokens: Sequence[int], groups: Sequence[int] | None = None) -> LayerTime:
    """``layer_compute_time`` with its parts (for reports and tests).

    ``groups[i]`` is the attention group (0 .. attn_dp - 1) request i runs on;
    None: ``assign_attention_groups``.
    """
    _validate(new_tokens, context_tokens)
    k = dep.attn_dp
    if groups is None:
        groups = _assign(model, dep, new_tokens, context_tokens)
    elif len(groups) != len(new_tokens) or any(not 0 <= g < k for g in groups):
        raise ValueError(f"groups: expected {len(new_tokens)} group numbers in 0..{k - 1}, got {list(groups)}")
    tokens, pairs, ctx = [0] * k, [0] * k, [0] * k  # per group: new tokens, query-key pairs, context tokens
    for n, c, g in zip(new_tokens, context_tokens, groups):
        n, c = int(n), int(c)
        tokens[g] += n
        pairs[g] += attention_pairs(n, c)
        ctx[g] += c
    slowest = max((_group_parts(model, dep, tokens[g], pairs[g], ctx[g]) for g in range(k)),
                  key=lambda parts: parts[0], default=(0.0,))
    experts = _expert_time(model, dep, sum(tokens))
    return LayerTime(slowest[0] + experts, *slowest[1:], experts=experts)


def layer_compute_time(model: ModelSpec, dep: Deployment, new_tokens: Sequence[int],
                       context_tokens: Sequence[int]) -> float:
    """Seconds one replica computes ONE layer of a prefill batch, communication excluded.

    ``new_tokens[i]`` tokens of request i are computed; they attend to
    ``context_tokens[i]`` = reused prefix + new tokens (so the attention term is
    quadratic in the new tokens and linear in the prefix).
    """
    return layer_compute_breakdown(model, dep, new_tokens, context_tokens).total


def prefill_compute_time(model: ModelSpec, dep: Deployment, new_tokens: Sequence[int],
                         context_tokens: Sequence[int]) -> float:
    """All layers of a batch back to back (no communication): a lower bound on its prefill."""
    return model.num_layers * layer_compute_time(model, dep, new_tokens, context_tokens)
