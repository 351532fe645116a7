"""The pool-manager interface: instance pools of a PD-disaggregated cluster (Arrow, paper 002 §5.2).

Instances are stateless: any one can prefill or decode. A pool manager
keeps them in four pools -- ``P`` (prefill), ``D`` (decode), ``P->D``
(flipped to decode, still finishing prefills) and ``D->P`` (flipped to
prefill, still finishing decodes) -- and places each request's prefill and
decode on an instance.

It is pure: a ``ClusterSnapshot`` (every instance's pool and load, as the
instance monitor last saw it) in, a decision out. Who calls, on the global
scheduler's thread (the simulator's cluster front end, or the serving
job's global scheduler):

- ``dispatch_prefill(request, snapshot, now)`` when a request arrives;
- ``dispatch_decode(request, snapshot, now)`` when its prefill finished
  (``request.prefill_instance`` set);
- ``rebalance(snapshot, now, tpot_slo)`` on every instance-monitor report (or
  period): it settles finished transitions and flips on monitored load.

The caller applies a decision's ``moves`` (in order; ``apply_moves`` does it
for a snapshot) before it sends the request to ``decision.instance``.
Flips take effect at once: an instance keeps finishing the work it holds
(that is what the transitional pools record) and takes new work of its new
kind immediately.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Sequence


class Pool(str, enum.Enum):
    PREFILL = "P"
    DECODE = "D"
    P_TO_D = "P->D"
    D_TO_P = "D->P"


PREFILL_POOLS = (Pool.PREFILL, Pool.D_TO_P)  # may take new prefills
DECODE_POOLS = (Pool.DECODE, Pool.P_TO_D)  # may take new decodes


@dataclass(frozen=True)
class PoolInstance:
    """One instance as the instance monitor last reported it."""

    id: str
    pool: Pool
    queued_prefill_tokens: tuple[int, ...] = ()  # prompt lengths of prefills queued or running, in order
    prefill_elapsed: float = 0.0  # seconds the head of that queue has already run
    running_tokens: int = 0  # tokens (prompt + output) of the decode requests it runs -- its decode load
    decoding: int = 0  # decode requests it runs
    avg_token_interval: float = 0.0  # s, from TokenIntervalMonitor (0 when it decoded nothing lately)

    def __post_init__(self) -> None:
        if not isinstance(self.pool, Pool):
            raise ValueError(f"instance {self.id}: pool must be one of {', '.join(p.value for p in Pool)}, got {self.pool!r}")
        if self.running_tokens < 0 or self.decoding < 0 or any(n < 1 for n in self.queued_prefill_tokens):
            raise ValueError(f"instance {self.id}: token counts must be >= 0 and prompt lengths >= 1")

    @property
    def has_prefill(self) -> bool:
        return bool(self.queued_prefill_tokens)

    @property
    def has_decode(self) -> bool:
        return self.decoding > 0


@dataclass(frozen=True)
class ClusterSnapshot:
    instances: tuple[PoolInstance, ...]

    def __post_init__(self) -> None:
        ids = [i.id for i in self.instances]
        if len(set(ids)) != len(ids):
            raise ValueError(f"cluster snapshot: duplicate instance ids in {ids}")

    def pool(self, *pools: Pool) -> list[PoolInstance]:
        return [i for i in self.instances if i.pool in pools]

    def get(self, instance_id: str) -> PoolInstance:
        for i in self.instances:
            if i.id == instance_id:
                return i
        raise KeyError(instance_id)


@dataclass(frozen=True)
class PoolRequest:
    """A request to place; ``prefill_instance`` is set once its prefill ran (for the decode dispatch)."""

    id: str
    arrival: float
    prompt_tokens: int
    ttft_slo: float
    tpot_slo: float
    prefill_instance: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or not (self.ttft_slo > 0 and self.tpot_slo > 0 and math.isfinite(self.arrival)):
            raise ValueError(f"request {self.id}: prompt_tokens >= 1, ttft_slo > 0, tpot_slo > 0 and a finite arrival needed")


@dataclass(frozen=True)
class PoolMove:
    instance: str
    src: Pool
    dst: Pool


@dataclass(frozen=True)
class PoolDecision:
    instance: str
    moves: tuple[PoolMove, ...] = ()


def flip_to_decode(inst: PoolInstance) -> PoolMove:
    """Figure 5: P goes to P->D while it still holds prefills, else straight to D; D->P returns to D."""
    if inst.pool not in PREFILL_POOLS:
        raise ValueError(f"instance {inst.id} is in pool {inst.pool.value}, not a prefill pool")
    dst = Pool.DECODE if inst.pool is Pool.D_TO_P or not inst.has_prefill else Pool.P_TO_D
    return PoolMove(inst.id, inst.pool, dst)


def flip_to_prefill(inst: PoolInstance) -> PoolMove:
    """Figure 5: D goes to D->P while it still holds decodes, else straight to P; P->D returns to P."""
    if inst.pool not in DECODE_POOLS:
        raise ValueError(f"instance {inst.id} is in pool {inst.pool.value}, not a decode pool")
    dst = Pool.PREFILL if inst.pool is Pool.P_TO_D or not inst.has_decode else Pool.D_TO_P
    return PoolMove(inst.id, inst.pool, dst)


def settle(snapshot: ClusterSnapshot) -> list[PoolMove]:
    """Figure 5's completion edges: P->D without prefills -> D, D->P without decodes -> P."""
    moves = []
    for i in snapshot.instances:
        if i.pool is Pool.P_TO_D and not i.has_prefill:
            moves.append(PoolMove(i.id, i.pool, Pool.DECODE))
        elif i.pool is Pool.D_TO_P and not i.has_decode:
            moves.append(PoolMove(i.id, i.pool, Pool.PREFILL))
    return moves


def apply_moves(snapshot: ClusterSnapshot, moves: Sequence[PoolMove]) -> ClusterSnapshot:
    """The snapshot after ``moves`` (what a caller's own pool table must do too)."""
    pools = {i.id: i.pool for i in snapshot.instances}
    for m in moves:
        if pools.get(m.instance) is not m.src:
            raise ValueError(f"move of {m.instance} from {m.src.value}: it is in {pools.get(m.instance)}")
        pools[m.instance] = m.dst
    return ClusterSnapshot(tuple(replace(i, pool=pools[i.id]) for i in snapshot.instances))


class PoolManager(ABC):
    """Places prefills and decodes and moves instances between pools (one per cluster)."""

    name: ClassVar[str] = ""
    # How the simulator lays the run's GPUs out for this manager: "as-given" (one instance per
    # --instances unit), or the paper's vLLM baselines' wider instances (vllm.py).
    shape: ClassVar[str] = "as-given"
    # True: every instance prefills and decodes (no P/D pools; decode stays where it prefilled).
    colocated: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_profile(cls, samples: Sequence[tuple[float, float]], **options: Any) -> "PoolManager":
        """A manager whose TTFT predictor is fitted to ``(prompt tokens, seconds)`` samples."""

    @abstractmethod
    def dispatch_prefill(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        """The instance that prefills ``request`` (and any flips made to find it)."""

    @abstractmethod
    def dispatch_decode(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        """The instance that decodes ``request`` (and any flips made to find it)."""

    def rebalance(self, snapshot: ClusterSnapshot, now: float, tpot_slo: float) -> tuple[PoolMove, ...]:
        """Flips on monitored load against the cluster's ``tpot_slo``; the default keeps the pools."""
        return ()
