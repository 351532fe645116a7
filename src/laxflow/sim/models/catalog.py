"""The models, GPUs and deployments of the MFS evaluation (paper 001, §2.2 and §6).

Read by the serving simulator's presets through ``get_model`` and
``get_deployment``. Shapes are copied from the public Hugging Face
``config.json`` of each model (cited per entry); ``tests/sim/models`` checks
that each model's parameter count lands on its published total, which catches
a mistyped shape.

Deployments (paper §6.1-6.3):
  * large-scale simulation: 8 A100s per server on NVSwitch (the paper states
    900 GB/s), one 200 Gbit/s NIC per GPU, 1:1 fat tree;
    Mixtral-8x22B and Grok-2 TP4 EP8 and DBRX TP2 EP16 and Qwen3-Coder TP1
    EP32 on 32-GPU units; Llama3-8B (1M context) TP4 SP4 on 16-GPU units.
  * testbed: 4 RTX 3090s per server on PCIe Gen3, two 100 Gbit/s NICs per
    server (50 Gbit/s per GPU); Mixtral-8x7B TP1 EP8, two units on 16 GPUs.
"""

from __future__ import annotations

from laxflow.errors import UserError
from laxflow.sim.models.spec import Deployment, GPUSpec, ModelSpec

_HF = "https://huggingface.co/"

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(name="mixtral-8x7b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8,
                  head_dim=128, ffn_hidden=14336, num_experts=8, top_k=2, vocab=32000,
                  max_context=32768, source=_HF + "mistralai/Mixtral-8x7B-Instruct-v0.1 config.json"),
        ModelSpec(name="mixtral-8x22b", num_layers=56, hidden=6144, num_heads=48, num_kv_heads=8,
                  head_dim=128, ffn_hidden=16384, num_experts=8, top_k=2, vocab=32768,
                  max_context=65536, source=_HF + "mistralai/Mixtral-8x22B-Instruct-v0.1 config.json"),
        ModelSpec(name="dbrx", num_layers=40, hidden=6144, num_heads=48, num_kv_heads=8,
                  head_dim=128, ffn_hidden=10752, num_experts=16, top_k=4, vocab=100352,
                  max_context=32768,
                  source=_HF + "databricks/dbrx-instruct config.json (d_model, n_heads, kv_n_heads, "
                  "ffn_hidden_size, moe_num_experts, moe_top_k)"),
        # Grok-2: Grok-1's layout at hidden 8192, 64 query / 8 KV heads of 128,
        # 131072 positions, and a dense MLP next to 8 experts ("residual_moe";
        # as in SGLang's Grok-2 support). FFN widths 16384 per expert and
        # 32768 dense reproduce the parameter counts published for
        # xai-org/grok-2 (269.5 B total, 115.0 B active) within 0.2 %.
        ModelSpec(name="grok-2", num_layers=64, hidden=8192, num_heads=64, num_kv_heads=8,
                  head_dim=128, ffn_hidden=16384, num_experts=8, top_k=2, vocab=131072,
                  max_context=131072, shared_ffn_hidden=32768,
                  source=_HF + "xai-org/grok-2 config.json and discussions/6 (parameter breakdown)"),
        # The paper cites Qwen3-Coder [71]; the open-weight Qwen3-Coder with
        # many small experts that fits TP1 EP32 on A100s is 480B-A35B.
        ModelSpec(name="qwen3-coder", num_layers=62, hidden=6144, num_heads=96, num_kv_heads=8,
                  head_dim=128, ffn_hidden=2560, num_experts=160, top_k=8, vocab=151936,
                  max_context=262144, source=_HF + "Qwen/Qwen3-Coder-480B-A35B-Instruct config.json"),
        # The paper runs Llama3-8B with a 1M-token window: same shapes as
        # Meta-Llama-3-8B, RoPE rescaled (gradientai/Llama-3-8B-Instruct-Gradient-1048k).
        ModelSpec(name="llama3-8b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8,
                  head_dim=128, ffn_hidden=14336, vocab=128256, max_context=1048576,
                  source=_HF + "meta-llama/Meta-Llama-3-8B config.json; "
                  + _HF + "gradientai/Llama-3-8B-Instruct-Gradient-1048k (1M context)"),
        # FlowPrefill's dense models (its §6.1).
        ModelSpec(name="qwen2.5-14b", num_layers=48, hidden=5120, num_heads=40, num_kv_heads=8,
                  head_dim=128, ffn_hidden=13824, vocab=152064, max_context=131072,
                  source=_HF + "Qwen/Qwen2.5-14B-Instruct config.json (131072 with YaRN, its model card)"),
        ModelSpec(name="llama3-70b", num_layers=80, hidden=8192, num_heads=64, num_kv_heads=8,
                  head_dim=128, ffn_hidden=28672, vocab=128256, max_context=131072,
                  source=_HF + "meta-llama/Llama-3.1-70B-Instruct config.json"),
    )
}

# Efficiency factors (the same for both GPUs; they are assumptions, not measurements):
#   mfu 0.6: large bf16 GEMMs reach 70-80 % of peak on A100 with cuBLAS; a
#     serving engine's prefill (fused MoE grouped GEMMs with a few hundred
#     tokens per expert, epilogues, kernel gaps) runs below that, and we assume
#     0.6, the top of the 0.5-0.6 range usually quoted for prefill.
#   attn_eff 0.5: FlashAttention-2 forward reaches 50-73 % of peak on A100 (Dao
#     2023); causal masking and short sequences sit at the low end.
#   mbu 0.8: streaming kernels reach about 80-90 % of HBM bandwidth on A100;
#     weight-streaming GEMMs at small batch sizes about 80 %.
GPUS: dict[str, GPUSpec] = {
    "a100": GPUSpec(name="a100", peak_flops=312e12, mem_bw=2.039e12, mem_bytes=80 * 2**30,
                    mfu=0.6, attn_eff=0.5, mbu=0.8,
                    source="NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s dense bf16, 2039 GB/s HBM2e"),
    "rtx3090": GPUSpec(name="rtx3090", peak_flops=71e12, mem_bw=936e9, mem_bytes=24 * 2**30,
                       mfu=0.6, attn_eff=0.5, mbu=0.8,
                       source="NVIDIA GA102 (Ampere) whitepaper: RTX 3090 71 TFLOP/s fp16 tensor with fp32 "
                       "accumulate (what PyTorch fp16 matmuls use), 936 GB/s GDDR6X, 24 GB"),
    # The A800 is the A100 with NVLink cut to 400 GB/s (200 GB/s per direction,
    # FlowPrefill §6.1 "200 GB/s NVLink"); the compute and HBM are the A100's.
    "a800": GPUSpec(name="a800", peak_flops=312e12, mem_bw=2.039e12, mem_bytes=80 * 2**30,
                    mfu=0.6, attn_eff=0.5, mbu=0.8,
                    source="NVIDIA A800 80GB SXM4: A100 compute/HBM (312 TFLOP/s bf16, 2039 GB/s), NVLink 400 GB/s"),
}

_PAPER = "MFS paper §6.1/§6.3"
# The testbed preset, against the paper's own profile (§2.2, Fig. 5: under
# contention the all-to-all CCT grows 1.8x and TTFT 1.5x, so alone the
# all-to-alls are about 0.5/0.8 = 60 % of TTFT; prior work it cites: 40-60 %).
# What we take from where:
#   * hardware, from the paper (§6.1): RTX 3090, PCIe Gen3 inside a server,
#     2 x 100 Gbit/s ConnectX-5 per 4 GPUs = 50 Gbit/s per GPU (§2.2 says
#     "50 Gbps/GPU"), one ToR;
#   * GPU peaks, from NVIDIA's GA102 whitepaper (above); mfu / attn_eff / mbu
#     are the same stated assumptions as for the A100 (not profiled);
#   * network efficiency: line rate (no derating), PCIe Gen3 x16 at
#     15.75 GB/s per direction for intra-server traffic;
#   * the MoE exchange, from the software the paper names (vLLM on PyTorch
#     2.8, DP+EP): vLLM's default all2all backend allgather_reducescatter.
#   * NCCL's rings: one per channel, spread over the NICs (serving/plan.py).
# With these, one 2,000-token request alone spends 13 % of each layer in the
# all-to-alls and a full step (8 ranks x 8,192 tokens) 21 % (PCIe, not the
# NICs, is the bottleneck), against about 60 % implied by Fig. 5. Matching
# that would take the network at about 10-16 % of line rate; we have no
# measurement that justifies such a derating, so we do not apply one.
_A100_NODE = dict(gpu=GPUS["a100"], nic_gbps=200.0, gpus_per_node=8, intra_node_gbps=900 * 8.0)
# FlowPrefill's server: 8 x A800-SXM4-80GB, NVLink 200 GB/s per direction (= 1600 Gbit/s); its
# paper gives no NIC, we give the A100 nodes' 200 Gbit/s per GPU (P2D crosses servers here).
_A800_NODE = dict(gpu=GPUS["a800"], nic_gbps=200.0, gpus_per_node=8, intra_node_gbps=1600.0)
_FP = "FlowPrefill paper §6.1 (models, TP degrees, A800 server)"
_TESTBED_NODE = dict(gpu=GPUS["rtx3090"], nic_gbps=50.0, gpus_per_node=4,
                     # PCIe Gen3 x16: 15.75 GB/s per direction.
                     intra_node_gbps=126.0)

DEPLOYMENTS: dict[str, Deployment] = {
    d.name: d
    for d in (
        Deployment(name="mixtral-8x22b", model="mixtral-8x22b", tp=4, ep=8, gpus=32, source=_PAPER, **_A100_NODE),
        Deployment(name="grok-2", model="grok-2", tp=4, ep=8, gpus=32, source=_PAPER, **_A100_NODE),
        Deployment(name="dbrx", model="dbrx", tp=2, ep=16, gpus=32, source=_PAPER, **_A100_NODE),
        Deployment(name="qwen3-coder", model="qwen3-coder", tp=1, ep=32, gpus=32, source=_PAPER, **_A100_NODE),
        Deployment(name="llama3-8b", model="llama3-8b", tp=4, sp=4, gpus=16, source=_PAPER, **_A100_NODE),
        # FlowPrefill §6.1: Llama3-8B TP1, Qwen2.5-14B TP2, Llama3-70B TP4 on A800-SXM4 servers.
        Deployment(name="llama3-8b-tp1-a800", model="llama3-8b", tp=1, gpus=1, source=_FP, **_A800_NODE),
        Deployment(name="qwen2.5-14b", model="qwen2.5-14b", tp=2, gpus=2, source=_FP, **_A800_NODE),
        Deployment(name="llama3-70b", model="llama3-70b", tp=4, gpus=4, source=_FP, **_A800_NODE),
        # Not in the paper: the testbed's layout on the simulation's A100 nodes.
        Deployment(name="mixtral-8x7b", model="mixtral-8x7b", tp=1, ep=8, gpus=8,
                   source="testbed layout (paper §6.2) on A100 nodes", **_A100_NODE),
        # The testbed runs vLLM (PyTorch 2.8, so vLLM 0.10/0.11) with DP+EP on
        # PCIe GeForce cards, where DeepEP's NVLink/GPUDirect kernels do not
        # run: its MoE exchange is vLLM's default all2all backend,
        # allgather_reducescatter (every token to every EP rank), not a top-k dispatch.
        Deployment(name="testbed-mixtral-8x7b", model="mixtral-8x7b", tp=1, ep=8, gpus=8, ep_comm="allgather",
                   source="MFS paper §2.2/§6.1/§6.2: 8 servers x 4 RTX 3090, 2 x 100 Gbit/s ConnectX-5 "
                   "per server, PCIe Gen3 inside; prefill cluster of 16 GPUs = two TP1 EP8 units; vLLM's "
                   "default DP+EP all2all backend (allgather_reducescatter)",
                   **_TESTBED_NODE),
    )
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UserError(f"model {name!r}: expected one of {', '.join(MODELS)}") from None


def get_gpu(name: str) -> GPUSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise UserError(f"gpu {name!r}: expected one of {', '.join(GPUS)}") from None


def get_deployment(name: str) -> Deployment:
    """The paper's deployment named ``name`` (a model name, or ``testbed-mixtral-8x7b``)."""
    try:
        return DEPLOYMENTS[name]
    except KeyError:
        raise UserError(f"deployment {name!r}: expected one of {', '.join(DEPLOYMENTS)}") from None
