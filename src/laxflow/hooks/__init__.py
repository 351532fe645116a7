"""laxflow hooks: the prefill scheduler's interface to the node daemon.

``from laxflow.hooks import HooksClient`` in a serving engine;
:class:`~laxflow.daemon.inprocess.InProcessHooks` (beside the daemon core it
drives) in the simulator and tests. The interface, with who calls what and
when, is :mod:`laxflow.hooks.api`; the messages on the wire are
:mod:`laxflow.protocol.hooks`.
"""

from laxflow.hooks.api import Hooks, estimate_ttft, request_key
from laxflow.protocol.hooks import Estimate, Instance

__all__ = ["Estimate", "Hooks", "HooksClient", "Instance", "estimate_ttft", "request_key"]


def __getattr__(name: str):
    # Lazy: the client pulls in ZeroMQ.
    if name == "HooksClient":
        from laxflow.hooks.client import HooksClient

        return HooksClient
    if name == "InProcessHooks":
        # Not imported from here: hooks sit below the daemon, and the in-process hooks drive a daemon core.
        raise AttributeError("laxflow.hooks.InProcessHooks moved to laxflow.daemon.inprocess.InProcessHooks "
                             "(from laxflow.daemon.inprocess import InProcessHooks)")
    raise AttributeError(f"module 'laxflow.hooks' has no attribute {name!r}")
