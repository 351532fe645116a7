"""Workloads for the serving simulator: synthetic generators and real-trace loaders.

``generate(name, rate, num_requests, seed)`` builds a calibrated synthetic
workload (``WORKLOADS``); ``load_trace(path, format)`` reads a real trace
(``TRACE_FORMATS``). Both return :class:`Request` lists in arrival order.
"""

from laxflow.sim.workload.request import (
    Request,
    mean_input_tokens,
    prefix_reuse_fraction,
    summarize,
    with_poisson_arrivals,
)
from laxflow.sim.workload.slo_traces import SLO_WORKLOADS, SloWorkload, slo_of
from laxflow.sim.workload.synthetic import WORKLOADS, WorkloadSpec, generate
from laxflow.sim.workload.traces import TRACE_FORMATS, load_trace

__all__ = [
    "SLO_WORKLOADS", "SloWorkload", "slo_of", "TRACE_FORMATS", "WORKLOADS", "Request", "WorkloadSpec", "generate", "load_trace", "mean_input_tokens",
    "prefix_reuse_fraction", "summarize", "with_poisson_arrivals",
]
