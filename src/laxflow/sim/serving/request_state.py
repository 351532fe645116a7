"""One request's life in the serving simulator.

Created by the simulator when the request arrives (after routing and SLO),
advanced by the batch that prefills it, closed when its last P2D byte lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laxflow.sim.serving.router import Route


@dataclass(eq=False)
class RequestState:
    """Routing, deadline and progress of one request."""

    request: Any  # laxflow.sim.workload.Request
    index: int  # position in arrival order (warm-up requests are the first ones)
    route: Route
    slo: float  # s, TTFT budget (fixed from the workload before any policy runs)
    idle_ttft: float  # s, TTFT alone on the idle cluster (see slo.py)
    rank: int = 0  # attention-DP rank of its prefill unit that runs it (and holds its KV)
    batch: int | None = None  # id of the batch that prefills it
    batch_start: float | None = None
    compute_end: float | None = None
    p2d_pending: int = 0  # p2d flows issued and not yet delivered
    finish: float | None = None  # last P2D byte delivered: TTFT ends here
    stall: float = 0.0  # s its batch waited on the network (non-overlapped communication)
    bytes: dict[str, float] = field(default_factory=dict)  # bytes per stage attributed to this request

    @property
    def id(self) -> str:
        return str(self.request.id)

    @property
    def arrival(self) -> float:
        return float(self.request.arrival)

    @property
    def deadline(self) -> float:
        return self.arrival + self.slo

    @property
    def input_tokens(self) -> int:
        return int(self.request.input_tokens)

    @property
    def new_tokens(self) -> int:
        """Tokens this request's prefill computes (input minus reused prefix)."""
        return self.input_tokens - self.route.reused_tokens

    @property
    def remote_tokens(self) -> int:
        """Reused tokens fetched from another unit (stage 1)."""
        return self.route.remote_tokens

    @property
    def ttft(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    def add_bytes(self, stage: str, amount: float) -> None:
        self.bytes[stage] = self.bytes.get(stage, 0.0) + amount
