"""What a model, a GPU and a deployment are, as data.

The serving simulator reads these to size compute (``compute.py``), the
stage-2 collectives (``collectives.py``) and the KV traffic of stages 1 and 3
(``ModelSpec.kv_bytes_per_token_per_layer`` times tokens, split over the
GPUs that hold it by ``Deployment.kv_shard_bytes_per_token_per_layer``).
The concrete models, GPUs and deployments of the MFS evaluation live in
``catalog.py``; a user can build their own from these classes.

Units: bytes, FLOP, seconds, FLOP/s, bytes/s; network rates in Gbit/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from laxflow.errors import UserError

# The MoE exchanges a deployment may run (``Deployment.ep_comm``; bytes in collectives.py).
EP_COMMS = ("hierarchical", "allgather", "pairwise")


def _positive(owner: str, field: str, value: float) -> None:
    if not value > 0:
        raise UserError(f"{owner}: field '{field}': expected a positive number, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shapes of a decoder-only transformer, dense or mixture-of-experts.

    ``ffn_hidden`` is the intermediate size of ONE expert (or of the dense MLP
    when ``num_experts == 1``); every FFN is a gated (SwiGLU-style) MLP with
    three ``hidden x ffn_hidden`` matrices. ``shared_ffn_hidden`` is a dense MLP
    that runs on every token next to the routed experts (Grok-2 has one; 0 =
    none). ``source`` says where the numbers come from.
    """

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int
    num_experts: int = 1
    top_k: int = 1
    vocab: int
    dtype_bytes: int = 2
    max_context: int
    shared_ffn_hidden: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}"
        for f in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden", "num_experts", "top_k", "vocab", "dtype_bytes", "max_context"):
            _positive(owner, f, getattr(self, f))
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"{owner}: field 'num_kv_heads': expected a divisor of num_heads "
                            f"({self.num_heads}), got {self.num_kv_heads}")
        if self.top_k > self.num_experts:
            raise UserError(f"{owner}: field 'top_k': expected at most num_experts "
                            f"({self.num_experts}), got {self.top_k}")
        if self.shared_ffn_hidden < 0:
            raise UserError(f"{owner}: field 'shared_ffn_hidden': expected >= 0, got {self.shared_ffn_hidden}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def q_dim(self) -> int:
        """Width of the query projection (not always ``hidden``: Qwen3 has 96 x 128 > 6144)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection."""
        return self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """Bytes of K and V one token leaves in one layer's KV cache."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token leaves over all layers (stage-1/3 transfer size)."""
        return self.kv_bytes_per_token_per_layer * self.num_layers

    @property
    def attn_params_per_layer(self) -> int:
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    @property
    def expert_params(self) -> int:
        """Parameters of one expert (gate, up and down projections)."""
        return 3 * self.hidden * self.ffn_hidden

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden * self.num_experts if self.is_moe else 0

    @property
    def params_per_layer(self) -> int:
        return (self.attn_params_per_layer + self.num_experts * self.expert_params
                + self.router_params_per_layer + 3 * self.hidden * self.shared_ffn_hidden)

    @property
    def total_params(self) -> int:
        """All weights, embeddings and LM head counted separately (norms ignored: < 0.01 %)."""
        return self.num_layers * self.params_per_layer + 2 * self.vocab * self.hidden

    @property
    def active_params(self) -> int:
        """Weights one token touches: attention, router, top-k experts, shared MLP."""
        per_layer = (self.attn_params_per_layer + self.top_k * self.expert_params
                     + self.router_params_per_layer + 3 * self.hidden * self.shared_ffn_hidden)
        return self.num_layers * per_layer + 2 * self.vocab * self.hidden


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """A GPU as a roofline: peak matmul rate, memory bandwidth, and how much of each we get.

    ``mfu`` applies to projection and expert matmuls, ``attn_eff`` to the
    attention kernel (FlashAttention), ``mbu`` to every memory-bound operator
    (weights and KV streamed from HBM). ``source`` cites the peak numbers and
    justifies the efficiencies (see ``catalog.py``).
    """

    name: str
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    mem_bw: float  # HBM/GDDR bytes/s
    mem_bytes: float  # device memory, bytes
    mfu: float = 0.6
    attn_eff: float = 0.5
    mbu: float = 0.8
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"gpu {self.name!r}"
        for f in ("peak_flops", "mem_bw", "mem_bytes"):
            _positive(owner, f, getattr(self, f))
        for f in ("mfu", "attn_eff", "mbu"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise UserError(f"{owner}: field '{f}': expected a fraction in (0, 1], got {v!r}")

    def roofline(self, flops: float, bytes_moved: float, efficiency: float | None = None) -> float:
        """Seconds for one operator: the slower of its compute and its memory traffic."""
        eff = self.mfu if efficiency is None else efficiency
        return max(flops / (self.peak_flops * eff), bytes_moved / (self.mem_bw * self.mbu))


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """How one model replica (one prefill unit) is laid out on GPUs.

    Attention runs tensor-parallel over ``tp`` GPUs and sequence-parallel over
    ``sp`` groups of them; the remaining factor ``gpus / (tp * sp)`` is
    attention data parallelism (``attn_dp``: each group runs its own share of
    the batch's requests, as SGLang's DP attention and vLLM's DP+EP do). Experts
    are split over ``ep`` groups of ``gpus / ep`` GPUs each (``expert_tp``:
    each expert's FFN dimension is sharded across its group). GPUs are numbered
    node-major: GPU ``i`` sits on node ``i // gpus_per_node``, TP groups are
    contiguous, and each GPU has its own ``nic_gbps`` NIC.
    """

    name: str
    model: str  # name in catalog.MODELS
    tp: int = 1
    ep: int = 1
    sp: int = 1
    gpus: int  # GPUs per prefill unit / model replica
    gpu: GPUSpec
    nic_gbps: float  # per-GPU NIC, Gbit/s
    gpus_per_node: int = 8
    intra_node_gbps: float = 0.0  # per-GPU bandwidth to peers in the node (NVLink / PCIe), Gbit/s
    # How the MoE all-to-all moves tokens (collectives.py, EP_COMMS): "hierarchical"
    # (DeepEP / Megatron: once per token and remote node, NVSwitch fan-out),
    # "allgather" (vLLM's default allgather_reducescatter, ring-based) or
    # "pairwise" (a flat all-to-all: every token straight to each of its top-k experts' GPUs).
    ep_comm: str = "hierarchical"
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"deployment {self.name!r}"
        for f in ("tp", "ep", "sp", "gpus", "nic_gbps", "gpus_per_node"):
            _positive(owner, f, getattr(self, f))
        if self.gpus % (self.tp * self.sp):
            raise UserError(f"{owner}: field 'gpus': expected a multiple of tp * sp "
                            f"({self.tp * self.sp}), got {self.gpus}")
        if self.gpus % self.ep:
            raise UserError(f"{owner}: field 'gpus': expected a multiple of ep ({self.ep}), got {self.gpus}")
        if self.ep_comm not in EP_COMMS:
            raise UserError(f"{owner}: field 'ep_comm': expected one of {', '.join(EP_COMMS)}, got {self.ep_comm!r}")

    @property
    def attn_dp(self) -> int:
        """Attention data-parallel groups: independent ``tp x sp`` groups splitting the requests."""
        return self.gpus // (self.tp * self.sp)

    @property
    def expert_tp(self) -> int:
        """GPUs sharing one expert group (each holds 1/expert_tp of every local expert)."""
        return self.gpus // self.ep

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * 1e9 / 8

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def check_model(self, model: ModelSpec) -> None:
        """Raise UserError unless ``model`` can be laid out this way and fits in memory."""
        owner = f"deployment {self.name!r} of model {model.name!r}"
        if model.is_moe and model.num_experts % self.ep:
            raise UserError(f"{owner}: field 'ep': expected a divisor of num_experts "
                            f"({model.num_experts}), got {self.ep}")
        if not model.is_moe and self.ep != 1:
            raise UserError(f"{owner}: field 'ep': a dense model needs ep = 1, got {self.ep}")
        weights = weight_bytes_per_gpu(model, self)
        if weights > self.gpu.mem_bytes:
            raise UserError(f"{owner}: weights need {weights / 2**30:.1f} GiB per GPU, more than the "
                            f"{self.gpu.mem_bytes / 2**30:.0f} GiB of a {self.gpu.name}")

    def kv_shard_bytes_per_token_per_layer(self, model: ModelSpec) -> int:
        """KV bytes of one token in one layer held by ONE GPU of the TP group that owns it.

        KV heads are split across ``tp`` (replicated when tp > num_kv_heads), so a
        request's layer KV lives on ``tp`` GPUs of one attention group, each
        holding this much per token. Stage-1 and stage-3 flows move these shards.
        """
        heads = math.ceil(model.num_kv_heads / self.tp)
        return 2 * heads * model.head_dim * model.dtype_bytes


def weight_bytes_per_gpu(model: ModelSpec, dep: Deployment) -> float:
    """Bytes of weights one GPU holds: its TP shard of attention and shared MLP, its experts' shard."""
    b = model.dtype_bytes
    dense = (model.attn_params_per_layer + 3 * model.hidden * model.shared_ffn_hidden
             + model.router_params_per_layer) / dep.tp
    if model.is_moe:
        experts = model.num_experts / dep.ep * model.expert_params / dep.expert_tp
    else:
        experts = model.expert_params / dep.tp
    embed = 2 * model.vocab * model.hidden / dep.tp
    return b * (model.num_layers * (dense + experts) + embed)
