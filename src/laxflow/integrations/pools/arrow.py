"""``arrow`` pool manager (Arrow, paper 002 §5.3-5.5, Algorithms 1-4).

- Prefill (Algorithm 1): the P instance with the least predicted queueing
  delay if the request's TTFT then holds, else the D->P one, else -- only if
  decode load is low (the overload rule: decode first) -- flip a decode
  instance (Algorithm 3), else the P choice anyway.
- Decode (Algorithm 2): stay on the prefill instance if it now decodes;
  else the D (then P->D) instance with the fewest running tokens if it is
  under ``max_running_tokens`` and its token interval under the TPOT SLO;
  else flip a prefill instance (Algorithm 4, no load check); else the least
  loaded of the two.
- Rebalance (monitor): settle finished transitions; flip a prefill instance
  to decode when the decode pool's mean token interval exceeds the TPOT SLO,
  or when an idle prefill instance could relieve busy decode instances.

The queueing delay is the quadratic TTFT predictor summed over the prefills
an instance holds, less what its head has already run (TTFT, Eq. 1-2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from laxflow.integrations.prefill.base import TtftPredictor
from laxflow.integrations.prefill.iteration import build_config, check_positive
from laxflow.integrations.pools.base import (
    DECODE_POOLS,
    PREFILL_POOLS,
    ClusterSnapshot,
    Pool,
    PoolDecision,
    PoolInstance,
    PoolManager,
    PoolMove,
    PoolRequest,
    apply_moves,
    flip_to_decode,
    flip_to_prefill,
    settle,
)


@dataclass(frozen=True)
class ArrowConfig:
    # Profiled at startup (§5.3): the most tokens one instance's KV cache and
    # one TPOT-SLO batch can hold. Required: it is a property of model and GPU.
    max_running_tokens: int = 0
    # "Load of decode instances is low" (Algorithm 1) is not quantified in the
    # paper: ours -- mean running tokens below this share of the maximum and
    # no decode instance over the TPOT SLO. Same value for every workload.
    low_decode_load: float = 0.5

    def __post_init__(self) -> None:
        if not (isinstance(self.max_running_tokens, int) and self.max_running_tokens >= 1):
            raise ValueError(f"ArrowConfig.max_running_tokens: must be an integer >= 1 (profiled), got {self.max_running_tokens!r}")
        check_positive("ArrowConfig", low_decode_load=self.low_decode_load)
        if self.low_decode_load > 1:
            raise ValueError(f"ArrowConfig.low_decode_load: must be in (0, 1], got {self.low_decode_load!r}")


class Arrow(PoolManager):
    name = "arrow"

    def __init__(self, predictor: TtftPredictor, config: ArrowConfig) -> None:
        self.predictor = predictor
        self.config = config

    @classmethod
    def from_profile(cls, samples: Sequence[tuple[float, float]], **options: Any) -> "Arrow":
        return cls(TtftPredictor(samples, degree=2), build_config(ArrowConfig, options))

    # -- loads ---------------------------------------------------------------------------
    def prefill_delay(self, inst: PoolInstance) -> float:
        """Predicted queueing delay of a new prefill on ``inst`` (seconds)."""
        work = sum(self.predictor(n) for n in inst.queued_prefill_tokens)
        return max(0.0, work - inst.prefill_elapsed)

    def _least_delay(self, insts: list[PoolInstance]) -> PoolInstance | None:
        return min(insts, key=lambda i: (self.prefill_delay(i), i.id)) if insts else None

    @staticmethod
    def _least_tokens(insts: list[PoolInstance]) -> PoolInstance | None:
        return min(insts, key=lambda i: (i.running_tokens, i.id)) if insts else None

    def decode_load_low(self, snapshot: ClusterSnapshot, tpot_slo: float) -> bool:
        """Overload rule's check before Algorithm 3 may take a decode instance."""
        dec = snapshot.pool(*DECODE_POOLS)
        if not dec:
            return False
        mean = sum(i.running_tokens for i in dec) / len(dec)
        return mean < self.config.low_decode_load * self.config.max_running_tokens and all(
            i.avg_token_interval <= tpot_slo for i in dec)

    # -- Algorithms 3 and 4 ----------------------------------------------------------------
    def try_move_decode_to_prefill(self, snapshot: ClusterSnapshot) -> PoolMove | None:
        """Algorithm 3: keep at least one decode-capable instance; prefer P->D, least running tokens."""
        d, p2d = snapshot.pool(Pool.DECODE), snapshot.pool(Pool.P_TO_D)
        if len(d) + len(p2d) <= 1:
            return None
        return flip_to_prefill(self._least_tokens(p2d) or self._least_tokens(d))

    def try_move_prefill_to_decode(self, snapshot: ClusterSnapshot) -> PoolMove | None:
        """Algorithm 4: keep at least one prefill-capable instance; prefer D->P, least prefill delay."""
        p, d2p = snapshot.pool(Pool.PREFILL), snapshot.pool(Pool.D_TO_P)
        if len(p) + len(d2p) <= 1:
            return None
        return flip_to_decode(self._least_delay(d2p) or self._least_delay(p))

    # -- Algorithms 1 and 2 ----------------------------------------------------------------
    def dispatch_prefill(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        t1 = self._least_delay(snapshot.pool(Pool.PREFILL))
        t2 = self._least_delay(snapshot.pool(Pool.D_TO_P))
        own = self.predictor(request.prompt_tokens)
        threshold = request.ttft_slo - (now - request.arrival)
        for t in (t1, t2):
            if t is not None and self.prefill_delay(t) + own <= threshold:
                return PoolDecision(t.id)
        # With no prefill-capable instance at all, a flip is the only way on.
        if self.decode_load_low(snapshot, request.tpot_slo) or (t1 is None and t2 is None):
            move = self.try_move_decode_to_prefill(snapshot)
            if move is not None:
                return PoolDecision(move.instance, (move,))
        fallback = t1 or t2
        if fallback is None:
            raise ValueError("arrow: no instance can take a prefill (every instance decodes and none can flip)")
        return PoolDecision(fallback.id)

    def _fits(self, inst: PoolInstance | None, tpot_slo: float) -> bool:
        return inst is not None and inst.running_tokens <= self.config.max_running_tokens and \
            inst.avg_token_interval <= tpot_slo

    def dispatch_decode(self, request: PoolRequest, snapshot: ClusterSnapshot, now: float) -> PoolDecision:
        if request.prefill_instance is not None:
            try:
                own = snapshot.get(request.prefill_instance)
            except KeyError:
                own = None
            if own is not None and own.pool in DECODE_POOLS:
                return PoolDecision(own.id)  # no KV transfer (§5.3)
        t1 = self._least_tokens(snapshot.pool(Pool.DECODE))
        t2 = self._least_tokens(snapshot.pool(Pool.P_TO_D))
        for t in (t1, t2):
            if self._fits(t, request.tpot_slo):
                return PoolDecision(t.id)
        move = self.try_move_prefill_to_decode(snapshot)
        if move is not None:
            return PoolDecision(move.instance, (move,))
        cands = [t for t in (t1, t2) if t is not None]
        if not cands:
            raise ValueError("arrow: no instance can take a decode (every instance prefills and none can flip)")
        return PoolDecision(min(cands, key=lambda i: i.running_tokens).id)

    # -- monitor ---------------------------------------------------------------------------
    def rebalance(self, snapshot: ClusterSnapshot, now: float, tpot_slo: float) -> tuple[PoolMove, ...]:
        """Settle transitions, then at most one flip to decode (§5.5 cases 2 and 3); one per call
        so a flip's effect shows in the next report before the next one."""
        moves = settle(snapshot)
        snap = apply_moves(snapshot, moves)
        dec = snap.pool(*DECODE_POOLS)
        if not dec:
            return tuple(moves)
        # The mean over the instances that decode now: an idle decode instance has no token
        # interval, and counting it as 0 would hide a slow pool behind a freshly flipped one.
        active = [i for i in dec if i.has_decode]
        slow = bool(active) and sum(i.avg_token_interval for i in active) / len(active) > tpot_slo
        # Busy = not low (the same test Algorithm 1 applies before taking a decode instance).
        busy = slow or not self.decode_load_low(snap, tpot_slo)
        if slow:
            flip = self.try_move_prefill_to_decode(snap)
        elif busy:
            idle = [i for i in snap.pool(*PREFILL_POOLS) if not i.has_prefill]
            flip = flip_to_decode(idle[0]) if idle and len(snap.pool(*PREFILL_POOLS)) > 1 else None
        else:
            flip = None
        return tuple(moves) + ((flip,) if flip else ())
