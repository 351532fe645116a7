"""The roofline layer-time model: a hand-computed tiny case, then shape and scaling sanity."""

from __future__ import annotations

import pytest

from laxflow.sim.models import (
    DEPLOYMENTS,
    GPUS,
    Deployment,
    GPUSpec,
    ModelSpec,
    assign_attention_groups,
    attention_pairs,
    get_deployment,
    get_model,
    layer_compute_breakdown,
    layer_compute_time,
)

# Peak 1 GFLOP/s: matmuls at mfu 0.5 -> 5e8 FLOP/s, attention at 0.25 -> 2.5e8;
# 1 GB/s at mbu 0.5 -> 5e8 B/s.
TOY_GPU = GPUSpec(name="toy", peak_flops=1e9, mem_bw=1e9, mem_bytes=1e9, mfu=0.5, attn_eff=0.25, mbu=0.5)
# hidden 64, q = 4 x 16 = 64, kv = 2 x 16 = 32, ffn 128, fp16.
TOY = ModelSpec(name="toy", num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                ffn_hidden=128, vocab=100, max_context=1024)
ONE_GPU = Deployment(name="toy-1", model="toy", gpus=1, gpu=TOY_GPU, nic_gbps=100)


def test_tiny_dense_model_by_hand_compute_bound() -> None:
    # 8 new tokens, no prefix:
    #   qkv  2*8*64*(64+64)   = 131072 FLOP -> 262.144 us (bytes 19456 -> 38.9 us)
    #   attn 4*4*16*36 pairs  =   9216 FLOP -> 36.864 us  (pairs = 8*9/2)
    #   out  2*8*64*64        =  65536 FLOP -> 131.072 us
    #   ffn  6*8*64*128       = 393216 FLOP -> 786.432 us
    t = layer_compute_breakdown(TOY, ONE_GPU, [8], [8])
    assert t.qkv == pytest.approx(262.144e-6)
    assert t.attention == pytest.approx(36.864e-6)
    assert t.out_proj == pytest.approx(131.072e-6)
    assert t.dense_ffn == pytest.approx(786.432e-6)
    assert t.total == pytest.approx(1216.512e-6)
    assert t.router == 0 and t.experts == 0


def test_tiny_dense_model_by_hand_memory_bound() -> None:
    # One token: weights dominate.
    #   qkv  bytes 2*(64*128 + 1*(64+128)) = 16768 -> 33.536 us  > 16384 FLOP -> 32.768 us
    #   attn FLOP 4*4*16*1 = 256 -> 1.024 us  > bytes 2*(1*2*32 + 2*64) = 384 -> 0.768 us
    #   out  bytes 2*(64*64 + 1*(64+64))   =  8448 -> 16.896 us  > 8192 FLOP -> 16.384 us
    #   ffn  bytes 2*(3*64*128 + 1*(128+384)) = 50176 -> 100.352 us > 49152 FLOP -> 98.304 us
    assert layer_compute_time(TOY, ONE_GPU, [1], [1]) == pytest.approx(151.808e-6)


def test_tiny_model_reused_prefix_enters_attention_only() -> None:
    # 8 new tokens after a 16-token prefix: pairs = 8*16 + 36 = 164 -> 4*4*16*164 = 41984 FLOP -> 167.936 us.
    t = layer_compute_breakdown(TOY, ONE_GPU, [8], [24])
    assert attention_pairs(8, 24) == 164
    assert t.attention == pytest.approx(167.936e-6)
    assert t.total == pytest.approx(262.144e-6 + 167.936e-6 + 131.072e-6 + 786.432e-6)


def test_tiny_moe_experts_by_hand() -> None:
    moe = ModelSpec(name="toy-moe", num_layers=1, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                    ffn_hidden=32, num_experts=4, top_k=2, vocab=100, max_context=1024)
    dep = Deployment(name="toy-ep2", model="toy-moe", ep=2, gpus=2, gpu=TOY_GPU, nic_gbps=100)
    # 8 tokens x top-2 = 16 pairs, 8 per expert group of one GPU:
    #   6*64*32*8 = 98304 FLOP -> 196.608 us; bytes: 2 local experts, touched 2*(1 - 0.5**8),
    #   2*(1.9921875*3*64*32 + 8*(2*64 + 3*32)) = 28064 -> 56.128 us.
    t = layer_compute_breakdown(moe, dep, [4, 4], [4, 4])
    assert t.experts == pytest.approx(196.608e-6)
    # The two requests run on the two attention groups side by side.
    alone = layer_compute_breakdown(moe, dep, [4], [4])
    assert t.qkv == pytest.approx(alone.qkv) and t.attention == pytest.approx(alone.attention)
    assert assign_attention_groups(moe, dep, [4, 4], [4, 4]) == [0, 1]


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_monotonic_in_new_tokens_and_in_context(name: str) -> None:
    d = get_deployment(name)
    m = get_model(d.model)
    prev = 0.0
    for n in (1, 16, 256, 2048, 8192):
        t = layer_compute_time(m, d, [n] * 4, [n] * 4)
        assert t > prev
        prev = t
    prev = 0.0
    for prefix in (0, 1024, 8192, 32768):
        t = layer_compute_time(m, d, [1024], [1024 + prefix])
        assert t > prev
        prev = t


def test_attention_term_is_quadratic_and_projections_linear() -> None:
    m, d = get_model("llama3-8b"), get_deployment("llama3-8b")
    a = layer_compute_breakdown(m, d, [32768], [32768])
    b = layer_compute_breakdown(m, d, [65536], [65536])
    assert b.attention / a.attention == pytest.approx(4.0, rel=0.01)
    assert b.qkv / a.qkv == pytest.approx(2.0, rel=0.01)
    assert b.dense_ffn / a.dense_ffn == pytest.approx(2.0, rel=0.01)
    # At a million tokens of context attention dominates the layer.
    long = layer_compute_breakdown(m, d, [8192], [1 << 20])
    assert long.attention > 0.5 * long.total


def test_work_is_divided_over_the_gpus_of_the_replica() -> None:
    m = get_model("llama3-8b")
    one = Deployment(name="llama-1", model="llama3-8b", gpus=1, gpu=GPUS["a100"], nic_gbps=200)
    sixteen = get_deployment("llama3-8b")  # TP4 x SP4
    n = [16384]
    assert layer_compute_time(m, one, n, n) / layer_compute_time(m, sixteen, n, n) == pytest.approx(16, rel=0.05)


def test_small_batches_are_memory_bound_on_expert_weights() -> None:
    m, d = get_model("mixtral-8x22b"), get_deployment("mixtral-8x22b")
    t = layer_compute_breakdown(m, d, [1], [1])
    expert_bytes = m.dtype_bytes * 3 * m.hidden * m.ffn_hidden / d.expert_tp  # one local expert, touched or not
    touched = 1 - (1 - 2 / 8) ** 1
    assert t.experts == pytest.approx(touched * expert_bytes / (d.gpu.mem_bw * d.gpu.mbu), rel=0.01)


def test_empty_batch_and_bad_input() -> None:
    m, d = get_model("dbrx"), get_deployment("dbrx")
    assert layer_compute_time(m, d, [], []) == 0.0
    with pytest.raises(ValueError):
        layer_compute_time(m, d, [10], [5])
    with pytest.raises(ValueError):
        layer_compute_time(m, d, [10, 1], [10])


def test_explicit_attention_groups_balance_or_not_is_the_callers_choice():
    """Per-rank batching: the caller says each request's attention-DP rank; the layer waits for the slowest."""
    m, d = get_model("qwen3-coder"), get_deployment("qwen3-coder")  # TP1: 32 attention-DP ranks
    balanced = layer_compute_breakdown(m, d, [256] * 32, [256] * 32, groups=list(range(32)))
    piled = layer_compute_breakdown(m, d, [256] * 32, [256] * 32, groups=[0] * 32)
    assert piled.total > 5 * balanced.total  # one rank runs everything while 31 idle
    assert balanced.experts == piled.experts  # the experts see the same tokens either way
    with pytest.raises(ValueError, match="groups"):
        layer_compute_breakdown(m, d, [256], [256], groups=[32])


def test_attention_pairs_of_a_batch_are_their_float_sum_to_the_last_bit() -> None:
    """The layer sums its requests' pairs in integers: the same value as their floats summed in order
    (decode steps of long contexts, a long prefill chunk), so step times do not depend on how."""
    news = [1] * 50 + [4096, 3]
    ctxs = [100_000 + 7 * i for i in range(50)] + [130_000, 9]
    t = layer_compute_breakdown(TOY, ONE_GPU, news, ctxs)
    pairs = sum(float(attention_pairs(n, c)) for n, c in zip(news, ctxs))
    # TOY on one GPU: attention reads the context's K and V (2 x kv) and writes q per new token, twice.
    attention = TOY_GPU.roofline(4 * 4 * 16 * pairs, 2 * (sum(ctxs) * 2 * 32 + 2 * sum(news) * 64), TOY_GPU.attn_eff)
    assert t.attention == attention
