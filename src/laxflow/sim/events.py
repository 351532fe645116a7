"""The simulator's one event order.

Every discrete-event loop in laxflow (the network engine, the serving model)
pushes onto an :class:`EventQueue`. The heap key is ``(time, priority, seq)``,
defined here and nowhere else: events at the same time run in ``Priority``
order, and events of equal time and priority in the order they were pushed, so
a run is deterministic for a given seed. Events themselves are never compared.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Any, Callable


class Priority(IntEnum):
    """Order of events that share a timestamp (smaller runs first).

    Completions run before anything else so that capacity freed at time t is
    visible to whatever arrives at t; the rate recompute runs last, once, after
    every same-time event has changed the flow set.
    """

    COMPLETION = 0  # a flow's last byte arrives
    COMPUTE = 10  # a compute step (layer, batch) ends
    ARRIVAL = 20  # a flow or a request arrives
    TIMER = 30  # a policy timer fires
    RECOMPUTE = 100  # the network recomputes rates after all of the above


Handler = Callable[..., Any]


class EventQueue:
    """A min-heap of ``(time, priority, seq, handler, args)`` entries.

    Owned by one simulation loop on one thread. ``push`` returns the entry's
    sequence number; entries cannot be removed, so owners that need to cancel
    keep a generation counter and ignore stale handlers.
    """

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self._heap: list[tuple[float, int, int, Handler, tuple]] = []
        self._seq = itertools.count()
        self.now = start

    def push(self, time: float, priority: Priority | int, handler: Handler, *args: Any) -> int:
        if time < self.now:
            raise ValueError(f"event at t={time!r} is in the past (now={self.now!r})")
        seq = next(self._seq)
        heapq.heappush(self._heap, (time, int(priority), seq, handler, args))
        return seq

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time(self) -> float:
        """Time of the next event, or +inf when the queue is empty."""
        return self._heap[0][0] if self._heap else float("inf")

    def nothing_else_now(self) -> bool:
        """No other event is due at ``now``: an event pushed now at any
        priority would be the next to run (so its owner may run it in place)."""
        heap = self._heap
        return not heap or heap[0][0] > self.now

    def step(self) -> bool:
        """Pop the next event, advance ``now`` to it, run it. False when empty."""
        if not self._heap:
            return False
        time, _, _, handler, args = heapq.heappop(self._heap)
        self.now = time
        handler(*args)
        return True

    def run(self, until: float = float("inf")) -> int:
        """Run events with time <= ``until``; return how many ran."""
        n = 0
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            time, _, _, handler, args = pop(heap)  # as step(), without its call per event
            self.now = time
            handler(*args)
            n += 1
        return n
