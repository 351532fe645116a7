"""Serving metrics shared by the simulator, the engine glue and the routers (pure functions)."""

from laxflow.integrations.metrics.tdg import TdgWeights, tdg_gain, tdg_ideal, tdg_ratio, token_weight

__all__ = ["TdgWeights", "tdg_gain", "tdg_ideal", "tdg_ratio", "token_weight"]
