"""laxflow hooks: the prefill scheduler's interface to the node daemon.

``from laxflow.hooks import HooksClient`` in a serving engine;
:class:`~laxflow.hooks.inprocess.InProcessHooks` in the simulator. The
interface, with who calls what and when, is :mod:`laxflow.hooks.api`.
"""

from laxflow.hooks.api import Hooks, estimate_ttft, request_key
from laxflow.hooks.messages import Estimate, Instance

__all__ = ["Estimate", "Hooks", "HooksClient", "InProcessHooks", "Instance", "estimate_ttft", "request_key"]


def __getattr__(name: str):
    # Lazy: the client pulls in ZeroMQ, the in-process hooks the daemon core.
    if name == "HooksClient":
        from laxflow.hooks.client import HooksClient

        return HooksClient
    if name == "InProcessHooks":
        from laxflow.hooks.inprocess import InProcessHooks

        return InProcessHooks
    raise AttributeError(name)
