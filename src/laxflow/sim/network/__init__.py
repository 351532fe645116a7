"""The flow-level network engine.

``Topology`` and its factories describe links; ``FluidNetwork`` moves the
bytes of live flows under a :class:`~laxflow.policy.base.FlowPolicy`
(strict priority across levels, max-min fair inside one); ``scenario`` loads
the JSON scenario files of ``laxflow sim flows``.
"""

from laxflow.sim.network.allocator import Usage, allocate, water_fill
from laxflow.sim.network.engine import FluidNetwork
from laxflow.sim.network.topology import Topology, big_switch, leaf_spine, mfs_testbed

__all__ = [
    "FluidNetwork",
    "Topology",
    "Usage",
    "allocate",
    "big_switch",
    "leaf_spine",
    "mfs_testbed",
    "water_fill",
]
