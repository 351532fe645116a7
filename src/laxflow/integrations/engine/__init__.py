"""A CPU PyTorch prefill engine with operator-level preemption (FlowPrefill §5.1), ``torch`` extra.

``model.LlamaModel`` (per-operator forward), ``pool.ExecutionPool`` (one
running task, suspended ones kept), ``engine.PrefillEngine`` (a prefill
scheduler from ``laxflow.integrations.prefill`` driving the pool on arrival
and completion), ``tp`` (tensor parallelism over gloo processes).
"""

from laxflow.integrations.engine.engine import PrefillEngine, profile_predictor
from laxflow.integrations.engine.model import OPS, ForwardState, LlamaModel, ModelConfig
from laxflow.integrations.engine.pool import ExecutionPool, LayerHooks, LocalCollective

__all__ = [
    "OPS", "ExecutionPool", "ForwardState", "LayerHooks", "LlamaModel", "LocalCollective", "ModelConfig",
    "PrefillEngine", "profile_predictor",
]
