"""The serving simulator: disaggregated prefill/decode units coupled with the fluid network.

``ServingSimulator`` runs one workload under one flow policy; ``experiment``
runs policies side by side, sweeps rates and holds the paper's presets;
``laxflow sim serve`` / ``laxflow sim sweep`` are the commands.
"""

from laxflow.sim.serving.config import ClusterConfig, ServingConfig
from laxflow.sim.serving.experiment import PRESETS, Preset, RunSpec, run_all, run_one
from laxflow.sim.serving.metrics import summarize
from laxflow.sim.serving.simulator import ServingSimulator, SimResult

__all__ = [
    "PRESETS", "ClusterConfig", "Preset", "RunSpec", "ServingConfig", "ServingSimulator", "SimResult", "run_all",
    "run_one", "summarize",
]
