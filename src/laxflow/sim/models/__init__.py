"""Models, GPUs and deployments as data, and what they cost: compute time and collective bytes.

Used by the serving simulator (``laxflow.sim.serving``) and its presets.
"""

from laxflow.sim.models.catalog import DEPLOYMENTS, GPUS, MODELS, get_deployment, get_gpu, get_model
from laxflow.sim.models.collectives import CollectiveTraffic, collective_bytes_per_layer, ep_node_hits
from laxflow.sim.models.compute import (
    LayerTime,
    assign_attention_groups,
    attention_pairs,
    layer_compute_breakdown,
    layer_compute_time,
    prefill_compute_time,
)
from laxflow.sim.models.spec import Deployment, GPUSpec, ModelSpec, weight_bytes_per_gpu

__all__ = [
    "DEPLOYMENTS", "GPUS", "MODELS", "CollectiveTraffic", "Deployment", "GPUSpec", "LayerTime", "ModelSpec",
    "assign_attention_groups", "attention_pairs", "collective_bytes_per_layer", "ep_node_hits", "get_deployment", "get_gpu", "get_model",
    "layer_compute_breakdown", "layer_compute_time", "prefill_compute_time", "weight_bytes_per_gpu",
]
