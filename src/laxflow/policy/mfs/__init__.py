"""Multi-stage Flow Scheduling (MFS), the ``mfs`` flow policy.

The family, top down:

* :mod:`.policy` -- :class:`MfsPolicy`: batch and request tables, RED order
  and pruning (``set_order``, Algorithm 1), completion, ``forget``; and the
  reference decision step, vectorized in NumPy (run when the C core is not
  built, and the oracle the tests hold the core to);
* :mod:`.core` -- the C core's binding (``_core``, built from ``core.c`` /
  ``core.h`` by ``core_build.py``) and the CPython glue (``_glue``, from
  ``glue.c``) that admits and completes flows in C;
* the paper's rules it is built from, shared with the coordinator:
  :mod:`laxflow.policy.rmlq`, :mod:`~laxflow.policy.mlu`,
  :mod:`~laxflow.policy.rli`, :mod:`~laxflow.policy.red`,
  :mod:`~laxflow.policy.arbitration`, :mod:`~laxflow.policy.inter_request`.

``laxflow.policy.mfs:MfsPolicy`` is the name the policy registry gives ``mfs``.
"""

from laxflow.policy.mfs.policy import MfsPolicy

__all__ = ["MfsPolicy"]
