"""The catalog's shapes and deployments against the published models and the MFS paper."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.sim.models import DEPLOYMENTS, GPUS, MODELS, Deployment, ModelSpec, get_deployment, get_model

# Published totals (model cards / release posts), in parameters.
PUBLISHED = {
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "mixtral-8x22b": (141e9, 39e9),
    "dbrx": (132e9, 36e9),
    "grok-2": (269.5e9, 115.0e9),
    "qwen3-coder": (480e9, 35e9),
    "llama3-8b": (8.03e9, 8.03e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_totals(name: str) -> None:
    total, active = PUBLISHED[name]
    m = get_model(name)
    assert m.total_params == pytest.approx(total, rel=0.02)
    assert m.active_params == pytest.approx(active, rel=0.03)


def test_kv_bytes_per_token_are_k_and_v_of_the_kv_heads() -> None:
    m = get_model("mixtral-8x7b")
    assert m.kv_bytes_per_token_per_layer == 2 * 8 * 128 * 2
    assert m.kv_bytes_per_token == 4096 * 32
    assert get_model("llama3-8b").max_context == 1 << 20


@pytest.mark.parametrize(
    "name, tp, ep, sp, gpus",
    [("mixtral-8x22b", 4, 8, 1, 32), ("grok-2", 4, 8, 1, 32), ("dbrx", 2, 16, 1, 32),
     ("qwen3-coder", 1, 32, 1, 32), ("llama3-8b", 4, 1, 4, 16), ("testbed-mixtral-8x7b", 1, 8, 1, 8)],
)
def test_paper_deployments(name: str, tp: int, ep: int, sp: int, gpus: int) -> None:
    d = get_deployment(name)
    assert (d.tp, d.ep, d.sp, d.gpus) == (tp, ep, sp, gpus)
    d.check_model(get_model(d.model))  # divisible and fits in memory


def test_gpu_and_network_of_each_setting() -> None:
    tb = get_deployment("testbed-mixtral-8x7b")
    assert tb.gpu is GPUS["rtx3090"] and tb.nic_gbps == 50 and tb.gpus_per_node == 4
    assert tb.nodes == 2 and tb.attn_dp == 8 and tb.expert_tp == 1
    big = get_deployment("mixtral-8x22b")
    assert big.gpu is GPUS["a100"] and big.nic_gbps == 200 and big.gpus_per_node == 8
    assert big.attn_dp == 8 and big.expert_tp == 4 and big.nic_bytes_per_s == 25e9
    assert all(d.model in MODELS for d in DEPLOYMENTS.values())


def test_kv_shard_per_gpu_splits_kv_heads_over_tp() -> None:
    d, m = get_deployment("llama3-8b"), get_model("llama3-8b")
    assert d.kv_shard_bytes_per_token_per_layer(m) == 2 * 2 * 128 * 2
    wide = Deployment(name="x", model="llama3-8b", tp=16, gpus=16, gpu=GPUS["a100"], nic_gbps=200)
    assert wide.kv_shard_bytes_per_token_per_layer(m) == 2 * 1 * 128 * 2  # heads replicated past 8


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(UserError, match="model 'gpt-5'.*mixtral-8x7b"):
        get_model("gpt-5")
    with pytest.raises(UserError, match="deployment 'nope'.*testbed-mixtral-8x7b"):
        get_deployment("nope")


def test_bad_shapes_and_layouts_name_the_field() -> None:
    with pytest.raises(UserError, match="field 'num_kv_heads'"):
        ModelSpec(name="bad", num_layers=1, hidden=8, num_heads=4, num_kv_heads=3, head_dim=2,
                  ffn_hidden=8, vocab=10, max_context=16)
    with pytest.raises(UserError, match="field 'top_k'"):
        ModelSpec(name="bad", num_layers=1, hidden=8, num_heads=4, num_kv_heads=2, head_dim=2,
                  ffn_hidden=8, num_experts=2, top_k=3, vocab=10, max_context=16)
    with pytest.raises(UserError, match="field 'gpus'.*tp \\* sp"):
        Deployment(name="bad", model="dbrx", tp=4, sp=2, gpus=12, gpu=GPUS["a100"], nic_gbps=200)
    with pytest.raises(UserError, match="field 'ep'"):
        Deployment(name="bad", model="dbrx", tp=1, ep=32, gpus=32, gpu=GPUS["a100"],
                   nic_gbps=200).check_model(get_model("dbrx"))


def test_a_model_that_does_not_fit_is_refused() -> None:
    d = Deployment(name="small", model="grok-2", tp=1, ep=8, gpus=8, gpu=GPUS["rtx3090"], nic_gbps=50)
    with pytest.raises(UserError, match="GiB per GPU"):
        d.check_model(get_model("grok-2"))
