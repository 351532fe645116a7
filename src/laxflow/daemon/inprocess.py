"""The hooks interface straight into a daemon core (simulator, tests).

Created by whoever owns the core and its clock (the simulator with its event
clock); every call runs on the caller's thread and applies at ``clock()``.
Request ids go through :func:`~laxflow.hooks.api.request_key` as in the
daemon, so a core fed by both this and shim events joins them the same way.
It lives beside the core it drives: the daemon uses the hooks interface,
never the other way round.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from laxflow.daemon.core import DaemonCore
from laxflow.hooks.api import Hooks, estimate_ttft, request_key
from laxflow.stage import Stage
from laxflow.protocol.hooks import Estimate, Instance

SWEEP_MIN = 1024  # names held before the first sweep for requests the core forgot


class InProcessHooks(Hooks):
    """The hooks into ``core`` at ``clock()``; see the module docstring.

    Requests are named to the core by their key; the hooks keep key -> the
    caller's name only while the core may still name the request in the
    pruned set: a request's name goes at ``request_done`` (or, pruned then,
    once it leaves the pruned set), and names of requests the core forgot
    without a ``request_done`` (its records are bounded in time) go at the
    next sweep, run when the names double since the last one.
    """

    def __init__(self, core: DaemonCore, clock: Callable[[], float]) -> None:
        self.core = core
        self.clock = clock
        self._names: dict[str, str] = {}  # key -> the caller's request name
        self._done: set[str] = set()  # keys of requests over but pruned: named until they leave the pruned set
        self._sweep_at = SWEEP_MIN
        self._subscribers: list[Callable[[set[str]], None]] = []
        self._last_pruned: set[str] = set()

    def _key(self, request: str) -> str:
        key = str(request_key(request))
        if key not in self._names and len(self._names) >= self._sweep_at:
            self._sweep()
        self._names[key] = request
        self._done.discard(key)
        return key

    def _sweep(self) -> None:
        """Drop the names of requests the core holds no record of and does not prune (amortized: O(1) a name)."""
        held, pruned = self.core.requests, self.core.pruned()
        self._names = {k: name for k, name in self._names.items() if k in held or k in pruned}
        self._done &= self._names.keys()
        self._sweep_at = max(SWEEP_MIN, 2 * len(self._names))

    def _drop_done(self) -> None:
        """Drop the names of requests over that are no longer pruned."""
        pruned = self.core.pruned()
        for key in [k for k in self._done if k not in pruned]:
            self._done.discard(key)
            self._names.pop(key, None)

    def register_request(self, request, deadline, prompt_tokens, reused_tokens=0, priority=0) -> None:
        self.core.register_request(self._key(request), deadline, prompt_tokens, reused_tokens, priority)

    def batch_formed(self, batch: str, requests: Iterable[str], compute_s: float = 0.0,
                     traffic: Mapping[str, Mapping[str, float]] | None = None) -> None:
        traffic = {p: {self._key(r): b for r, b in row.items()} for p, row in (traffic or {}).items()}
        self.core.batch_formed(batch, [self._key(r) for r in requests], self.clock(), compute_s, traffic)

    def layer_begin(self, batch: str, layer: int) -> None:
        self.core.layer_begin(batch, layer, self.clock())

    def layer_end(self, batch: str, layer: int, last: bool = False) -> None:
        if last:
            self.core.compute_done(batch, self.clock())

    def message_submit(self, msg_id, request, stage, layer, nbytes, port="", downstream=0.0) -> None:
        self.core.submit(msg_id, self._key(request), Stage.parse(stage), layer, nbytes, self.clock(),
                         port=port or None, downstream=downstream)

    def wait_permit(self, msg_id: int, timeout_s: float = 1.0) -> tuple[int, int] | None:
        """Steps the core once (no other thread would): granted now, or None."""
        self.poll()
        m = self.core.messages.get(msg_id)
        return None if m is None or m.granted is None else (m.level, m.dscp)

    def message_progress(self, msg_id: int, bytes_done: float) -> None:
        self.core.progress(msg_id, bytes_done, self.clock())

    def message_complete(self, msg_id: int) -> None:
        self.core.complete(msg_id, self.clock())

    def request_done(self, request: str) -> None:
        key = self._key(request)
        self.core.request_done(key, self.clock())
        if key in self.core.pruned():
            self._done.add(key)  # pruned() still names it until the pruned set lets it go
        else:
            del self._names[key]

    def pruned(self) -> set[str]:
        return {self._names.get(k, k) for k in self.core.pruned()}

    def subscribe_pruned(self, callback: Callable[[set[str]], None]) -> None:
        self._subscribers.append(callback)

    def dispatch_advice(self, request: str, instances: Sequence[Instance]) -> list[Estimate]:
        rates = {p.name: p.rate for p in self.core.ports}
        loads = dict(zip(rates, self.core.meter.loads().tolist()))
        return estimate_ttft(instances, rates, loads)

    def poll(self):
        """Step the core at ``clock()`` and tell subscribers if the pruned set changed; returns the step."""
        out = self.core.step(self.clock())
        now = self.pruned()
        if now != self._last_pruned:
            self._last_pruned = now
            self._drop_done()
            for cb in self._subscribers:
                cb(set(now))
        return out
