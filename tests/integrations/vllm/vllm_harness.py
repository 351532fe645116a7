"""A real vLLM v1 Scheduler on CPU, built from a tiny OPT-style model folder (no weights, no tokenizer).

Used by the tests in this folder: ``make_scheduler`` builds the scheduler the
way vLLM's EngineCore would (same config objects, same constructor), and
``step`` runs one schedule() and feeds update_from_output() the
ModelRunnerOutput a model runner would return (partial-prefill chunks sample
no token, completed prefills and decodes sample one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BLOCK = 16


def write_model(folder: Path) -> Path:
    """An OPT-style config.json: enough for ModelConfig, no weights needed by the scheduler."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 64, "ffn_dim": 128,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 64, "do_layer_norm_before": True, "torch_dtype": "float32",
        "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
    }))
    return folder


def make_scheduler(tmp: Path, scheduler_cls=None, max_num_batched_tokens: int = 256, max_num_seqs: int = 16,
                   num_blocks: int = 512, kv_transfer_config=None, enable_chunked_prefill: bool = True):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["VLLM_CACHE_ROOT"] = str(tmp / "vllm-cache")
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = write_model(tmp / "tiny-opt")
    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="float32", max_model_len=2048,
                               seed=0)
    scheduler_config = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                       max_model_len=2048, enable_chunked_prefill=enable_chunked_prefill,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=False)
    cache_config.num_gpu_blocks = num_blocks
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config, scheduler_config=scheduler_config,
                             device_config=DeviceConfig("cpu"), kv_transfer_config=kv_transfer_config)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0", "layer.1"],
                                          FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=16,
                                                            dtype=torch.float32))])
    cls = scheduler_cls or Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK, log_stats=False)


def make_request(rid: str, prompt_tokens: int, max_tokens: int = 4, arrival: float | None = None,
                 extra_args: dict | None = None, priority: int = 0):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, extra_args=extra_args, ignore_eos=True)
    params.update_from_generation_config({}, None)
    return Request(request_id=rid, prompt_token_ids=[7] * prompt_tokens, sampling_params=params,
                   pooling_params=None, arrival_time=arrival, priority=priority)


def step(scheduler):
    """One engine step: schedule(), then the output a model runner would give; returns the SchedulerOutput."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = scheduler.requests[rid]
        done = req.num_computed_tokens >= req.num_tokens  # schedule() already advanced num_computed_tokens
        sampled.append([11] if done else [])
    runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=sampled)
    scheduler.update_from_output(out, runner)
    return out
