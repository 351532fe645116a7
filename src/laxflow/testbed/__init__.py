"""The emulated fabric and the tools for real switches.

- :mod:`~laxflow.testbed.fabric`: network namespaces as hosts, a bridge
  "switch" whose egress ports are HTB strict-priority trees keyed on DSCP
  (``laxflow testbed up|down``), and :class:`Testbed`, the Python API.
- :mod:`~laxflow.testbed.capture`: DSCP histograms from the wire and crafted
  RoCEv2 probes (``verify-dscp``, ``probe``; scapy).
- :mod:`~laxflow.testbed.switch_config`: switch and NIC configuration from
  laxflow's DSCP map (``switch-config``).
- :mod:`~laxflow.testbed.scenario`: the contention scenario (``run``).

Everything that touches the kernel needs root; the switch configuration does
not.
"""

from laxflow.testbed.fabric import FabricConfig, Testbed

__all__ = ["FabricConfig", "Testbed"]
