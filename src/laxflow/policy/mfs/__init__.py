"""Multi-stage Flow Scheduling (MFS), the ``mfs`` flow policy.

The family, top down:

* :mod:`.policy` -- :class:`MfsPolicy`, shared by both routes: the
  coordinator's order, RED ranking and Algorithm 1's pruning, the
  infeasible set and the notes on the flows;
* its state and decision step, one of two, chosen at construction:
  ``Core`` in the C extension ``_core`` (built from ``core.h``, ``core.c``,
  ``core_tables.c``, ``core_step.c``) when built,
  else :class:`.reference.Reference` (Python and NumPy: the oracle the
  tests hold the core to);
* the paper's rules they are built from, shared with the coordinator:
  :mod:`laxflow.policy.rmlq`, :mod:`~laxflow.policy.mlu`,
  :mod:`~laxflow.policy.rli`, :mod:`~laxflow.policy.red`,
  :mod:`~laxflow.policy.arbitration`, :mod:`~laxflow.policy.inter_request`.

``laxflow.policy.mfs:MfsPolicy`` is the name the policy registry gives ``mfs``.
"""

from laxflow.policy.mfs.policy import MfsPolicy

__all__ = ["MfsPolicy"]
