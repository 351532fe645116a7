"""The iteration-level engine's metrics: now the one row of :mod:`laxflow.sim.serving.metrics`.

Kept so ``from laxflow.sim.serving.instances.metrics import summarize,
request_metrics`` (bench scripts, tests, users' scripts) keeps working:
``summarize(result, rate, label)`` is that module's :func:`summarize` (which
also takes the ``engine`` that ran the result), ``request_metrics`` its
per-sequence TTFT / TPOT / largest gap.
"""

from laxflow.sim.serving.metrics import request_metrics, summarize

__all__ = ["request_metrics", "summarize"]
