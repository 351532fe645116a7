"""The policy interface of the network engine.

Every flow-scheduling policy in laxflow (the baselines here, MFS, and any
out-of-tree one named ``module:Class``) implements :class:`FlowPolicy`. The
engine calls :meth:`FlowPolicy.decide` after every event that can change the
allocation (arrival, completion, a policy timer, an owner's explicit
reschedule such as a layer boundary), with a :class:`Snapshot` of the live
flows; the policy answers with a :class:`Decision`. The engine then allocates
rates: strict priority across levels (level 0 first, it sees all capacity),
max-min fair inside a level, each flow's optional rate cap honored.

Policies decide only. They do no I/O and start no threads; the daemon and the
coordinator call the same objects the simulator does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Sequence

import numpy as np

from laxflow.policy.flow import Flow, Stage

STAGE_CODES = {Stage.REUSE: 0, Stage.COLLECTIVE: 1, Stage.P2D: 2}


@dataclass
class Snapshot:
    """What a policy may look at. Arrays are aligned with ``flows``.

    ``flows`` are the live flows (arrived, unfinished) in the engine's stable
    order (admission order). ``link_load`` is the engine's measured load of
    each link (a time-weighted moving average of utilization in [0, 1]; see the
    engine for the window), which MLU uses as rho.
    """

    now: float
    flows: Sequence[Flow]
    remaining: np.ndarray  # bytes left per flow
    capacity: np.ndarray  # bytes/s per link
    link_load: np.ndarray  # measured utilization per link, in [0, 1]

    def column(self, name: str, dtype: type = float, missing: float = np.nan) -> np.ndarray:
        """A flow attribute as an array (``None`` becomes ``missing``)."""
        return np.fromiter(
            (missing if (v := getattr(f, name)) is None else v for f in self.flows),
            dtype=dtype,
            count=len(self.flows),
        )

    @cached_property
    def size(self) -> np.ndarray:
        return self.column("size")

    @cached_property
    def arrival(self) -> np.ndarray:
        return self.column("arrival")

    @cached_property
    def due(self) -> np.ndarray:
        """Due time per flow, NaN where the request has no deadline."""
        return np.fromiter(
            (np.nan if (d := f.due) is None else d for f in self.flows), dtype=float, count=len(self.flows)
        )

    @cached_property
    def stage(self) -> np.ndarray:
        """Stage codes per flow (see ``STAGE_CODES``)."""
        return np.fromiter((STAGE_CODES[f.stage] for f in self.flows), dtype=np.int8, count=len(self.flows))

    @cached_property
    def explicit(self) -> np.ndarray:
        """True where a flow has an explicit deadline (p2d with a deadline)."""
        return np.fromiter((f.has_explicit_deadline for f in self.flows), dtype=bool, count=len(self.flows))

    @cached_property
    def bottleneck_rate(self) -> np.ndarray:
        """Fastest rate each flow could get alone: min over its links of cap/weight."""
        return np.fromiter(
            (float(np.min(self.capacity[f.links] / f.weights)) for f in self.flows),
            dtype=float,
            count=len(self.flows),
        )


@dataclass
class Decision:
    """A policy's answer for one snapshot.

    ``level[i]`` is flow i's priority level: 0 is served first and sees all
    capacity; level k sees only what levels < k left. ``cap[i]`` is an
    optional rate cap in bytes/s (``inf`` for none). ``timers`` are absolute
    times at which the policy wants ``decide`` called again even if nothing
    else happens (e.g. a periodic promotion).
    """

    level: np.ndarray
    cap: np.ndarray | None = None
    timers: tuple[float, ...] = field(default_factory=tuple)


class FlowPolicy(ABC):
    """Base of every flow-scheduling policy.

    One instance schedules one network (one simulation run, one daemon); it
    may keep per-flow state in ``Flow.state``. ``decide`` is called on the
    engine's thread, never concurrently.
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def decide(self, snap: Snapshot) -> Decision:
        """Return each live flow's level (and optional cap, timers)."""

    def on_complete(self, flow: Flow, now: float) -> None:
        """Called by the engine when ``flow``'s last byte is delivered."""


def rank_levels(keys: Sequence[np.ndarray]) -> np.ndarray:
    """Dense rank of rows under a lexicographic key (last key is primary).

    Used by strict-priority policies that give every distinct key its own
    level: ``np.lexsort`` order, equal keys share a level.
    """
    n = len(keys[0]) if keys else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(keys)
    stacked = np.stack([np.asarray(k)[order] for k in keys])
    new = np.ones(n, dtype=bool)
    new[1:] = np.any(stacked[:, 1:] != stacked[:, :-1], axis=0)
    dense = np.cumsum(new) - 1
    level = np.empty(n, dtype=np.int64)
    level[order] = dense
    return level
