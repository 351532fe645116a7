"""Pure scheduling logic: MFS and the baselines.

Nothing in this package does I/O, opens sockets or starts threads. The network
engine, the node daemon and the coordinator call the very same objects.
"""

from laxflow.policy.base import Decision, FlowPolicy, Snapshot
from laxflow.policy.flow import Flow, Stage
from laxflow.policy.registry import available_policies, create_policy, register_policy

__all__ = [
    "Decision",
    "Flow",
    "FlowPolicy",
    "Snapshot",
    "Stage",
    "available_policies",
    "create_policy",
    "register_policy",
]
