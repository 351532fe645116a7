"""The policy interface of the network engine.

Every flow-scheduling policy in laxflow (the baselines here, MFS, and any
out-of-tree one named ``module:Class``) implements :class:`FlowPolicy`. The
engine calls :meth:`FlowPolicy.decide` after every event that can change the
allocation (arrival, completion, a policy timer, an owner's explicit
reschedule such as a layer boundary), with a :class:`Snapshot` of the live
flows; the policy answers with a :class:`Decision`. The engine then allocates
rates: strict priority across levels (level 0 first, it sees all capacity),
max-min fair inside a level, each flow's optional rate cap honored.

Every decision also says, per flow, the RMLQ queue (the switch class) and
the DSCP codepoint of that queue from the policy's :attr:`FlowPolicy.dscp_map`:
the simulator records them and the node daemon writes them into the shim's
permit table, from the very same arrays.

Policies decide only. They do no I/O and start no threads; the daemon and the
coordinator call the same objects the simulator does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Iterable, Sequence

import numpy as np

from laxflow.policy.dscp import DscpMap, default_dscp_map
from laxflow.policy.flow import STAGE_CODES, Flow

__all__ = ["STAGE_CODES", "Decision", "FlowPolicy", "Snapshot", "rank_levels"]

# The map a policy without its own uses: K = 8 switch classes (the most a
# RoCE fabric offers laxflow beside CNP and its lossless class).
BASELINE_DSCP_MAP = default_dscp_map(8)


@dataclass
class Snapshot:
    """What a policy may look at. Arrays are aligned with ``flows``.

    ``flows`` are the live flows (arrived, unfinished) in the engine's stable
    order (admission order). ``link_load`` is the measured load of each link:
    an exponentially weighted moving average of its utilization in [0, 1],
    ``load <- u + (load - u) * exp(-dt / load_window)`` over each interval dt
    at utilization u. Whoever builds the snapshot (the network engine, the
    node daemon from its byte counters) states that time constant in
    ``load_window``; MFS subtracts its own average of explicit-deadline
    traffic from it and refuses a snapshot whose window differs from its
    ``MfsConfig.load_window`` (the difference would be meaningless).
    """

    now: float  # s
    flows: Sequence[Flow]
    remaining: np.ndarray  # bytes left per flow
    capacity: np.ndarray  # bytes/s per link
    link_load: np.ndarray  # measured utilization per link, in [0, 1]
    load_window: float  # s, time constant of link_load's moving average
    # What an owner that decides again and again over one live set may add
    # (the network engine does, for a policy with ``keeps_tags``): the first
    # ``kept`` flows had the last decision, in the same order (0: none known);
    # ``progressed``, whose request progress (``Flow.current_layer``,
    # ``compute_done``) changed since the last decision (True: any flow's; a
    # list: those flows', as the owner named them; False: none); ``tag``, the
    # ``Decision.tag`` the owner kept per flow (int64, -1 for a new flow,
    # read-only; None: the owner keeps none); ``link_load_in_use``,
    # ``link_load`` unclipped and exact only on the links some live flow uses
    # (read-only; None: read ``link_load``).
    kept: int = 0
    progressed: bool | Sequence[Flow] = True
    tag: np.ndarray | None = None
    link_load_in_use: np.ndarray | None = None

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
        """Stage codes per flow (``laxflow.policy.flow.STAGE_CODES``, the shim's ``LXF_STAGE_*``)."""
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
    """A policy's answer for one snapshot; every array is aligned with ``snap.flows``.

    ``level[i]`` (int64) is flow i's host priority: a dense rank, 0 served
    first and seeing all capacity, level k only what levels < k left. It is
    the engine's (and the daemon's permit) order, finer than the switch's.
    ``queue[i]`` (int64) is flow i's RMLQ queue, the switch class it travels
    in: 0 is the top, ``dscp_map.levels`` the scavenger class (MFS's pruned
    requests). ``dscp[i]`` (uint8) is that queue's DSCP codepoint from the
    policy's ``dscp_map``: what the daemon writes into the permit table and
    the shim puts on the wire. ``queue`` is monotone in ``level`` (a lower
    level never has a larger queue). ``cap[i]`` is an optional rate cap in
    bytes/s (``inf`` for none). ``timers`` are absolute times at which the
    policy wants ``decide`` called again even if nothing else happens (e.g.
    a periodic promotion). ``tag[i]`` (int64) is the policy's own number
    for flow i, which an owner that keeps tags (``Snapshot.tag``) stores and
    hands back with the flow's next snapshots (None: keep them as they are).
    Build one with :meth:`FlowPolicy.decision`.
    """

    level: np.ndarray
    queue: np.ndarray
    dscp: np.ndarray
    cap: np.ndarray | None = None
    timers: tuple[float, ...] = field(default_factory=tuple)
    tag: np.ndarray | None = None


class FlowPolicy(ABC):
    """Base of every flow-scheduling policy.

    One instance schedules one network (one simulation run, one daemon); it
    may keep per-flow state in ``Flow.state``. ``decide`` is called on the
    engine's thread, never concurrently.

    ``dscp_map`` is the policy's level -> DSCP table. Baselines take one as
    ``dscp=`` (default: :data:`BASELINE_DSCP_MAP`, the default map for 8
    levels) and fold their dense levels onto it: queue = min(level, K-1), so
    the first K-1 levels get a switch class each and the rest share the
    lowest one (Fair Sharing: every flow in queue 0, one class). MFS uses
    ``MfsConfig.dscp_map`` and its own RMLQ queues.
    """

    name: ClassVar[str] = ""
    # Whether ``decide`` reads ``Snapshot.link_load``. The network engine
    # keeps the per-link moving average (a pass over the links in use at every
    # event) only for policies that do; a policy that says False and reads it
    # anyway gets a clear error from the engine's snapshot, never stale numbers.
    reads_link_load: ClassVar[bool] = True
    # Whether the policy's per-flow notes in ``Flow.state`` (MFS:
    # ``rmlq_level``) are wanted. The network engine sets it from its
    # ``flow_fields``: an owner that reads nothing back from the Flow objects
    # (the serving simulator) spares the policy the writes.
    flow_notes: bool = True
    # Whether ``decide`` uses the incremental snapshot (``Snapshot.kept``,
    # ``progressed``, ``tag``, ``link_load_in_use``): the network engine then
    # fills them in and stores each decision's ``tag``.
    keeps_tags: ClassVar[bool] = False
    _dscp_map: DscpMap = BASELINE_DSCP_MAP

    def __init__(self, dscp: DscpMap | None = None) -> None:
        if dscp is not None:
            if not isinstance(dscp, DscpMap):
                raise ValueError(f"policy {self.name or type(self).__name__}: dscp must be a DscpMap, got {dscp!r}")
            self._dscp_map = dscp

    @property
    def dscp_map(self) -> DscpMap:
        """Queue -> DSCP codepoint (and switch traffic class) of this policy's decisions."""
        return self._dscp_map

    @abstractmethod
    def decide(self, snap: Snapshot) -> Decision:
        """Return each live flow's level, queue and DSCP (and optional cap, timers)."""

    def decision(
        self,
        level: np.ndarray,
        *,
        queue: np.ndarray | None = None,
        cap: np.ndarray | None = None,
        timers: tuple[float, ...] = (),
    ) -> Decision:
        """A :class:`Decision` with DSCP codepoints from ``dscp_map``.

        ``queue`` defaults to the level folded onto the map's K levels,
        ``min(level, K-1)``. Called by ``decide`` implementations.
        """
        table = self.dscp_map.codes
        if queue is None:
            queue = np.minimum(level, len(table) - 2)
        return Decision(level=level, queue=queue, dscp=table[queue], cap=cap, timers=timers)

    def on_complete(self, flow: Flow, now: float) -> None:
        """Called by the engine when ``flow``'s last byte is delivered."""

    @property
    def pruned_requests(self) -> set[str] | None:
        """The requests in this policy's scavenger class now (pruned: MFS's
        Algorithm 1, or its coordinator's); None for a policy that keeps no
        pruned set (this default: only MFS prunes)."""
        return None

    def forget(self, batches: Iterable[str]) -> None:
        """Drop what the policy keeps about ``batches`` (batch ids) and their requests.

        Called by a long-running owner (the node daemon) when a batch has
        departed for good, so per-batch and per-request tables stay bounded.
        A batch that still has live flows is forgotten once its last flow
        completes. Names it never saw are ignored. This default keeps
        nothing per batch: a no-op. The simulator does not call it.
        """


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


def pruned_count(policy: FlowPolicy) -> int | None:
    """How many requests ``policy`` has pruned now (its ``pruned_requests``); None: it keeps no pruned set."""
    pruned = policy.pruned_requests
    return None if pruned is None else len(pruned)
