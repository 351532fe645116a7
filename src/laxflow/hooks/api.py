"""The hooks interface: what a prefill scheduler tells laxflow and asks it.

Two implementations, one interface (:class:`Hooks`):

* :class:`laxflow.hooks.client.HooksClient` -- in a serving engine; each call
  is one request/reply to the node daemon over ``ipc://`` (well under a
  millisecond on one machine). With the daemon gone, one call waits its
  timeout; after that every call returns at once (events dropped, queries
  answered as without laxflow, all counted) until the daemon answers again.
* :class:`laxflow.daemon.inprocess.InProcessHooks` -- in the simulator or a
  test: the same calls straight into a :class:`~laxflow.daemon.core.DaemonCore`
  with the caller's clock.

Who calls what, and when (the caller is the serving engine's prefill
scheduler unless said otherwise; every call is made from the scheduler's own
thread, never concurrently on one client object):

=========================  ==================================================
call                       when
=========================  ==================================================
``register_request``       a request is admitted (before it is batched)
``batch_formed``           a prefill batch is formed, before its first layer
``layer_begin``            the batch starts computing layer j (drives RLI)
``layer_end``              layer j's compute ended; ``last=True`` on the final
                           layer: compute done, stage-3 promotes on the period
``message_submit``         a transport without the shim (Python TCP, a
                           custom engine) is about to send one message
``wait_permit``            that transport blocks until the daemon grants it
``message_progress``       that transport's cumulative bytes sent
``message_complete``       that transport finished the message
``request_done``           the request's first token is out (or it was dropped)
``pruned``                 before scheduling a batch: requests MFS pruned
``subscribe_pruned``       once at start-up: callback on every change
                           (runs on a client thread)
``dispatch_advice``        when routing a new request: instances ranked by
                           estimated TTFT, network included
=========================  ==================================================

Deadlines are absolute wall-clock seconds for the client (``time.time()``),
the caller's clock for the in-process implementation.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from typing import Callable, Iterable, Mapping, Sequence

from laxflow.protocol.hooks import Estimate, Instance


def request_key(request: str | int) -> int:
    """The 63-bit id a request has in shared memory (``lxf_event.request_id``).

    Adapters tag messages with it; the daemon joins hooks calls and shim
    events on it. Decimal strings map to their value; other strings to a
    stable hash.
    """
    if isinstance(request, int):
        return request & ((1 << 63) - 1)
    if request.isdigit() and int(request) < 1 << 63:
        return int(request)
    return int.from_bytes(hashlib.blake2b(request.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)


def estimate_ttft(instances: Sequence[Instance], port_rate: Mapping[str, float], port_load: Mapping[str, float]
                  ) -> list[Estimate]:
    """Rank instances by queue + compute + network time, best first (ties by name).

    An instance whose estimate is not finite (a bandwidth near zero) is left
    out; :func:`unranked` names those. Network time = bytes / (bandwidth x (1 - measured load of the port)); the
    bandwidth is the instance's own, or the port's line rate. A saturated
    port (load 1) counts at 1 % of its rate rather than forever.
    """
    out = []
    for inst in instances:
        rate = inst.bandwidth if inst.bandwidth > 0 else port_rate.get(inst.port, 0.0)
        free = max(0.01, 1.0 - port_load.get(inst.port, 0.0))
        net = inst.nbytes / (rate * free) if inst.nbytes > 0 and rate > 0 else 0.0
        total = inst.queue_s + inst.compute_s + net
        if math.isfinite(total):
            out.append(Estimate(inst.name, total, net))
    return sorted(out, key=lambda e: (e.ttft_s, e.name))


def unranked(instances: Sequence[Instance], ranked: Sequence[Estimate]) -> tuple[str, ...]:
    """Names of instances ``estimate_ttft`` could not rank."""
    names = {e.name for e in ranked}
    return tuple(i.name for i in instances if i.name not in names)


class Hooks(ABC):
    """What the prefill scheduler calls (see the module docstring for when)."""

    @abstractmethod
    def register_request(self, request: str, deadline: float | None, prompt_tokens: int, reused_tokens: int = 0,
                         priority: int = 0) -> None: ...

    @abstractmethod
    def batch_formed(self, batch: str, requests: Iterable[str], compute_s: float = 0.0,
                     traffic: Mapping[str, Mapping[str, float]] | None = None) -> None: ...

    @abstractmethod
    def layer_begin(self, batch: str, layer: int) -> None: ...

    @abstractmethod
    def layer_end(self, batch: str, layer: int, last: bool = False) -> None: ...

    @abstractmethod
    def message_submit(self, msg_id: int, request: str, stage: str, layer: int | None, nbytes: float,
                       port: str = "", downstream: float = 0.0) -> None: ...

    @abstractmethod
    def wait_permit(self, msg_id: int, timeout_s: float = 1.0) -> tuple[int, int] | None:
        """(level, dscp) once granted; None if not granted within the timeout (send anyway: fail open)."""

    @abstractmethod
    def message_progress(self, msg_id: int, bytes_done: float) -> None: ...

    @abstractmethod
    def message_complete(self, msg_id: int) -> None: ...

    @abstractmethod
    def request_done(self, request: str) -> None: ...

    @abstractmethod
    def pruned(self) -> set[str]: ...

    @abstractmethod
    def subscribe_pruned(self, callback: Callable[[set[str]], None]) -> None: ...

    @abstractmethod
    def dispatch_advice(self, request: str, instances: Sequence[Instance]) -> list[Estimate]: ...
