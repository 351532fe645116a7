"""A small Llama-style transformer whose prefill runs one operator at a time.

The execution pool (``pool.py``) calls :meth:`LlamaModel.start` when a task
is first run, then :meth:`LlamaModel.run_op` once per operator, checking its
preemption signal between calls; everything a suspended prefill needs to go
on (layer, operator index, residual stream, the operator's output in flight)
lives in the :class:`ForwardState` it returns, so resuming is calling
``run_op`` again on the same state: the same kernels on the same tensors,
hence bitwise the same logits as an uninterrupted run.

Per layer, the five operators FlowPrefill places checks between (§5.1):
``qkv_proj`` (RMSNorm + fused QKV matmul), ``attn`` (rotary + causal GQA
attention, one segment per request of the batch), ``o_proj`` (+ residual),
``gate_up_proj`` (RMSNorm + fused gate/up matmul), ``down_proj`` (SwiGLU +
down matmul + residual). With tensor parallelism (``tp_size > 1``) QKV and
gate/up are column-parallel (heads and FFN columns split), o_proj and
down_proj row-parallel followed by an all_reduce over ``group`` (gloo).
Weights are drawn from one seeded generator at full size and sliced, so every
rank of every TP size holds the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

OPS = ("qkv_proj", "attn", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class ModelConfig:
    """Model size and seed; validated once on construction."""

    vocab: int = 1024
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 704
    rope_theta: float = 10000.0
    eps: float = 1e-5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.hidden % self.heads:
            raise ValueError(f"ModelConfig.hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelConfig.heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if (self.hidden // self.heads) % 2:
            raise ValueError("ModelConfig: head dimension must be even (rotary embedding)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(eq=False)
class ForwardState:
    """Where one task's prefill stands: the suspended state the pool keeps."""

    seg_lens: tuple[int, ...]  # tokens of each request of the batch, in order
    positions: torch.Tensor  # [T] position of each token inside its request
    x: torch.Tensor  # [T, hidden] residual stream
    layer: int = 0
    op: int = 0  # index into OPS of the next operator to run
    buf: Any = None  # output of the last operator when it is consumed by the next one
    ops_done: int = 0  # operators computed so far (the counter TP ranks agree on)
    logits: torch.Tensor | None = field(default=None)  # [requests, vocab] last-token logits when done

    @property
    def done(self) -> bool:
        return self.logits is not None


class LlamaModel:
    """Seeded random weights (this rank's shard) and the per-operator forward."""

    def __init__(self, config: ModelConfig, tp_rank: int = 0, tp_size: int = 1, group: Any = None) -> None:
        c = config
        if c.heads % tp_size or c.kv_heads % tp_size or c.ffn % tp_size:
            raise ValueError(f"heads, kv_heads and ffn must be divisible by tp_size={tp_size}")
        self.config, self.tp_rank, self.tp_size, self.group = c, tp_rank, tp_size, group
        self.heads, self.kv_heads = c.heads // tp_size, c.kv_heads // tp_size
        self.ffn = c.ffn // tp_size
        gen = torch.Generator().manual_seed(c.seed)

        def w(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=gen) * scale

        hd = c.head_dim
        self.embed = w(c.vocab, c.hidden, scale=1.0)
        self.lm_head = w(c.vocab, c.hidden, scale=c.hidden**-0.5)
        self.final_norm = 1.0 + w(c.hidden, scale=0.1)
        self.layer_weights = []
        for _ in range(c.layers):
            wq = w(c.heads * hd, c.hidden, scale=c.hidden**-0.5)
            wk = w(c.kv_heads * hd, c.hidden, scale=c.hidden**-0.5)
            wv = w(c.kv_heads * hd, c.hidden, scale=c.hidden**-0.5)
            wo = w(c.hidden, c.heads * hd, scale=(c.heads * hd) ** -0.5)
            wg = w(c.ffn, c.hidden, scale=c.hidden**-0.5)
            wu = w(c.ffn, c.hidden, scale=c.hidden**-0.5)
            wd = w(c.hidden, c.ffn, scale=c.ffn**-0.5)
            attn_norm, mlp_norm = 1.0 + w(c.hidden, scale=0.1), 1.0 + w(c.hidden, scale=0.1)
            self.layer_weights.append(self._shard(wq, wk, wv, wo, wg, wu, wd, attn_norm, mlp_norm))
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    def _shard(self, wq, wk, wv, wo, wg, wu, wd, attn_norm, mlp_norm) -> dict[str, torch.Tensor]:
        """This rank's columns of q/k/v and gate/up, rows (input dim) of o and down, fused."""
        hd, r = self.config.head_dim, self.tp_rank
        q = wq[r * self.heads * hd : (r + 1) * self.heads * hd]
        k = wk[r * self.kv_heads * hd : (r + 1) * self.kv_heads * hd]
        v = wv[r * self.kv_heads * hd : (r + 1) * self.kv_heads * hd]
        cols = slice(r * self.ffn, (r + 1) * self.ffn)
        return {
            "qkv": torch.cat([q, k, v]).contiguous(),
            "o": wo[:, r * self.heads * hd : (r + 1) * self.heads * hd].contiguous(),
            "gate_up": torch.cat([wg[cols], wu[cols]]).contiguous(),
            "down": wd[:, cols].contiguous(),
            "attn_norm": attn_norm,
            "mlp_norm": mlp_norm,
        }

    @property
    def total_ops(self) -> int:
        return self.config.layers * len(OPS)

    def start(self, token_ids: Sequence[Sequence[int]]) -> ForwardState:
        """The state before the first operator of a batch (one token-id list per request)."""
        if not token_ids or any(len(t) == 0 for t in token_ids):
            raise ValueError("a batch needs at least one request and every request at least one token")
        flat = torch.tensor([t for seq in token_ids for t in seq], dtype=torch.long)
        if int(flat.min()) < 0 or int(flat.max()) >= self.config.vocab:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab})")
        positions = torch.cat([torch.arange(len(t)) for t in token_ids])
        return ForwardState(tuple(len(t) for t in token_ids), positions, self.embed[flat])

    def run_op(self, s: ForwardState) -> None:
        """Compute the next operator of ``s`` in place (on the caller's thread)."""
        lw = self.layer_weights[s.layer]
        op = OPS[s.op]
        if op == "qkv_proj":
            s.buf = self._norm(s.x, lw["attn_norm"]) @ lw["qkv"].T
        elif op == "attn":
            s.buf = self._attention(s, s.buf)
        elif op == "o_proj":
            s.x = s.x + self._reduce(s.buf @ lw["o"].T)
            s.buf = None
        elif op == "gate_up_proj":
            s.buf = self._norm(s.x, lw["mlp_norm"]) @ lw["gate_up"].T
        else:  # down_proj
            gate, up = s.buf.split(self.ffn, dim=-1)
            s.x = s.x + self._reduce((F.silu(gate) * up) @ lw["down"].T)
            s.buf = None
        s.ops_done += 1
        s.op += 1
        if s.op == len(OPS):
            s.op, s.layer = 0, s.layer + 1
            if s.layer == self.config.layers:
                last = torch.tensor(s.seg_lens).cumsum(0) - 1
                s.logits = self._norm(s.x[last], self.final_norm) @ self.lm_head.T

    def forward(self, token_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Uninterrupted prefill: last-token logits per request (the reference for tests)."""
        s = self.start(token_ids)
        while not s.done:
            self.run_op(s)
        return s.logits

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.eps) * weight

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(partial, group=self.group)
        return partial

    def _rotary(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None].float() * self.inv_freq[None, :]  # [T, hd/2]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

    def _attention(self, s: ForwardState, qkv: torch.Tensor) -> torch.Tensor:
        hd = self.config.head_dim
        nq, nkv = self.heads * hd, self.kv_heads * hd
        tokens = qkv.shape[0]
        q = self._rotary(qkv[:, :nq].reshape(tokens, self.heads, hd), s.positions)
        k = self._rotary(qkv[:, nq : nq + nkv].reshape(tokens, self.kv_heads, hd), s.positions)
        v = qkv[:, nq + nkv :].reshape(tokens, self.kv_heads, hd)
        rep = self.heads // self.kv_heads
        out, begin = [], 0
        for n in s.seg_lens:  # causal attention inside each request only
            qs, ks, vs = (t[begin : begin + n].transpose(0, 1) for t in (q, k, v))
            ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
            out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
            begin += n
        return torch.cat(out).reshape(tokens, nq)
