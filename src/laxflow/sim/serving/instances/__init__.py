"""Iteration-level serving simulator: instances that loop steps, with decode, KV memory and routers.

The MFS prefill-unit simulator (``laxflow.sim.serving.simulator``) models
prefill and its communication; this package models what FairBatching,
ProServe and Arrow schedule: every forward step of every instance (mixed
prefill chunks and decodes on PD-colocated instances, prefill-only and
decode-only instances with P2D KV transfers when disaggregated), KV memory
with recompute preemption, TTFT / TPOT / per-token metrics and TDG.

Modules: ``config`` (InstanceSimConfig), ``profile`` (step time from the
compute model, BatchSample profile), ``instance`` (Seq, Instance: one step),
``decode`` (decode-instance batch former), ``dispatch`` (the Dispatcher plug
point; RouterDispatcher), ``engine`` (InstanceEngine: the event loop and the
pool manager's API), ``fabric`` (transfers as flows on the run's network,
shared with the unit-level ``batch.py``), ``layers`` (a prefill step whose KV
leaves per layer), ``metrics``, ``run`` (a RunSpec on this engine).
"""

from laxflow.sim.serving.instances.config import InstanceSimConfig
from laxflow.sim.serving.instances.engine import InstanceEngine, InstanceResult

__all__ = ["InstanceEngine", "InstanceResult", "InstanceSimConfig"]
