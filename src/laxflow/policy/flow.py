"""The flow model every policy sees.

A :class:`Flow` is one schedulable entity: a point-to-point transfer, or a
*flow group* (a collective among N GPUs treated as one entity). Either way it
has a sparse usage vector over links: ``links[k]`` carries ``weights[k]`` of
the flow's bytes, so at rate ``r`` (bytes/s of the whole flow) it loads link
``links[k]`` with ``weights[k] * r``. A point-to-point flow has weight 1 on
every link of its path; an all-to-all's weight on a port is that port's bytes
over the group's total.

Units: sizes in bytes, capacities and rates in bytes/s, times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A flow's stage and the stage codes (laxflow.stage, read from native/laxflow_shm.h), also importable
# from here beside Flow.
from laxflow.stage import STAGE_CODES, STAGE_NONE, STAGE_OF_CODE, Stage  # noqa: F401


_INF = float("inf")


@dataclass(eq=False)
class Flow:
    """One flow or flow group.

    Created by whoever issues traffic (a scenario file, the serving simulator,
    the node daemon from shim events) and handed to the network engine. The
    request-level fields (``current_layer``, ``compute_done``) are updated by
    the owner of the request as its prefill advances; the engine owns
    ``level``, ``cap``, ``finish`` and the live byte counts.
    """

    id: str
    size: float  # bytes, > 0
    links: np.ndarray  # int64 link indices (into the topology's link table)
    weights: np.ndarray  # float64, fraction of the flow's bytes on each link
    arrival: float = 0.0  # s
    stage: Stage = Stage.P2D
    request: str = ""  # defaults to the flow id
    batch: str = ""  # defaults to the request id
    deadline: float | None = None  # the request's absolute TTFT deadline, s
    downstream: float = 0.0  # time the request still needs after this flow, s
    layer: int | None = None  # target layer (reuse: needed before it; p2d: its KV)
    current_layer: int | None = None  # layer the request is computing now
    compute_done: bool = False  # the request's prefill compute has ended
    # The point-to-point flows this flow group stands for: a collective or a sharded KV move is one flow
    # in per-pair units (size: one pair's bytes), so size x pairs is the group's bytes. 1: a plain flow.
    pairs: float = 1.0

    # Written by the engine after each decision (the Decision's arrays), unless
    # its owner reads none of them (FluidNetwork's flow_fields=False: the
    # serving simulator); read by whoever reports per-flow classes.
    level: int | None = None  # host priority (dense rank, 0 first)
    queue: int | None = None  # RMLQ queue / switch class
    dscp: int | None = None  # DSCP codepoint of that queue
    cap: float = float("inf")
    finish: float | None = None
    # Policy-owned scratch (e.g. the layer at which a level was last set). The
    # engine never reads it.
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.request:
            self.request = self.id
        if not self.batch:
            self.batch = self.request
        self.links = np.asarray(self.links, dtype=np.int64)
        self.weights = np.asarray(self.weights, dtype=np.float64)
        if self.links.shape != self.weights.shape or self.links.ndim != 1 or self.links.size == 0:
            raise ValueError(f"flow {self.id!r}: links and weights must be equal-length, non-empty 1-D")

    @classmethod
    def trusted(
        cls,
        id: str,
        size: float,
        links: np.ndarray,
        weights: np.ndarray,
        *,
        arrival: float = 0.0,
        stage: Stage = Stage.P2D,
        request: str = "",
        batch: str = "",
        deadline: float | None = None,
        downstream: float = 0.0,
        layer: int | None = None,
        current_layer: int | None = None,
        compute_done: bool = False,
        pairs: float = 1.0,
    ) -> "Flow":
        """The flow the constructor would build, without its conversions and checks.

        For callers that issue many flows from arrays they already hold: the
        serving simulator's batches, whose transfer shapes come from
        ``Cluster.pattern`` (int64 ``links`` and float64 ``weights``, 1-D,
        equal length, non-empty, read-only). The arrays are kept as given (the
        constructor's ``np.asarray`` returns such arrays unchanged too), so the
        result equals ``Flow(...)``'s in every field; anything else passed here
        is the caller's bug, not caught.
        """
        # Plain attribute stores: the fastest way to fill a new instance (a
        # __dict__.update needs a keyword dict built first).
        flow = cls.__new__(cls)
        flow.id = id
        flow.size = size
        flow.links = links
        flow.weights = weights
        flow.arrival = arrival
        flow.stage = stage
        flow.request = request = request or id
        flow.batch = batch or request
        flow.deadline = deadline
        flow.downstream = downstream
        flow.layer = layer
        flow.current_layer = current_layer
        flow.compute_done = compute_done
        flow.pairs = pairs
        flow.level = flow.queue = flow.dscp = None
        flow.cap = _INF
        flow.finish = None
        flow.state = {}
        return flow

    @property
    def due(self) -> float | None:
        """When this flow must be done for its request to make its deadline."""
        if self.deadline is None:
            return None
        return self.deadline - self.downstream

    @property
    def has_explicit_deadline(self) -> bool:
        """A p2d flow whose request has a deadline (MLU applies; EDF orders it)."""
        return self.stage is Stage.P2D and self.deadline is not None

    @classmethod
    def on_path(cls, id: str, size: float, path: list[int] | np.ndarray, **kw: Any) -> "Flow":
        """A point-to-point flow: weight 1 on every link of ``path``."""
        links = np.asarray(path, dtype=np.int64)
        return cls(id=id, size=size, links=links, weights=np.ones(links.size), **kw)
