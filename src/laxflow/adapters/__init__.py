"""What each communication library needs to be scheduled by laxflow.

* :mod:`laxflow.adapters.gate` -- the permit client every adapter shares:
  submit a message to the node daemon through the shared-memory segment, wait
  for its permit off the caller's thread, report its completion; fails open.
* :mod:`laxflow.adapters.mooncake` -- a wrapper over Mooncake's
  ``TransferEngine`` with ``request``/``stage``/``layer``/``deadline`` keywords.
* :mod:`laxflow.adapters.nixl` -- a wrapper over NIXL's ``nixl_agent``: each
  posted transfer request gated as one message, UCX's TCP connections marked.
* :mod:`laxflow.adapters.sockets` -- which TCP sockets of this process talk to
  a peer (``/proc``), and marking them with a DSCP.
* :mod:`laxflow.adapters.nccl` -- the environment ``laxflow run`` gives NCCL
  (and Gloo) jobs, and the path of the NCCL profiler plugin.
* :mod:`laxflow.adapters.gloo` -- Gloo collectives gated and marked as stage-2
  messages in daemon mode.

Nothing here is imported by ``laxflow`` itself; Mooncake (NIXL) is imported only
when a wrapper is built without an engine (agent) of the caller's.
"""
