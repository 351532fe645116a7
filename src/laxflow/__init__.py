"""laxflow: a communication scheduler for disaggregated LLM serving.

laxflow implements Multi-stage Flow Scheduling (MFS): it decides, per node and
across the cluster, which transfer of which request goes first so that as many
requests as possible meet their time-to-first-token SLO.
"""

__version__ = "0.1.0"
