"""Elastic instance pools (Arrow, paper 002 §5) driving the iteration-level serving engine.

A :class:`PoolDispatcher` is the engine's dispatcher (``laxflow.sim.serving.
instances``: ``prefill_target`` / ``decode_target`` / ``after_step``, all on
the event-loop thread) for a pool manager from ``laxflow.integrations.pools``
(``arrow``, ``static-pd``, ``round-robin``). It owns:

- the pool table: every instance's pool (P, D, P->D, D->P), each mapped onto
  the engine's instance role -- P and D->P run the ``prefill`` role (the
  local batch scheduler, Sarathi-style: resident decodes first, then prefill
  chunks; a finished prompt leaves for its decode instance), D and P->D the
  ``decode`` role (every decode, then prefill chunks; a prompt finished there
  decodes there, no KV moves: Arrow §5.3). A flip changes the pool at once
  and the role from the instance's next step; the transitional pools settle
  (P->D -> D, D->P -> P, Figure 5) at the end of the step that drained them;
- one :class:`TokenIntervalMonitor` per instance (Insight 3), fed at every
  step end;
- the snapshot the pure manager reads: per instance the prompt lengths of
  the prefills it holds, the predicted work already done on them, its decode
  load (prompt + output tokens of its decodes), decode count and mean token
  interval.

Per arrival ``dispatch_prefill`` (Algorithm 1, may flip D -> P), per finished
prompt on a prefill-role instance ``dispatch_decode`` (Algorithm 2, may flip
P -> D), every ``monitor_period`` seconds of simulated time ``rebalance``
(§5.5 cases 2 and 3). Each decision's moves are applied to the table and
the engine before the request is placed.

The engine this drives needs: ``instances`` (id -> instance with ``role``,
``seqs`` (id -> sequence with ``prompt_tokens``, ``computed``, ``outputs``,
``is_prefill``, ``arrival``, ``ttft_slo``, ``tpot_slo``, ``prefill_instance``),
``decoding()``, ``schedulers`` (role -> batch scheduler), ``kv_capacity``),
``set_role(id, role)``, ``timer.seconds([(new, context), ...])`` and ``seqs``
(the run's sequences, each with ``prompt`` and ``tpot_slo``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from laxflow.errors import UserError
from laxflow.integrations.pools import (
    DECODE_POOLS,
    PREFILL_POOLS,
    ClusterSnapshot,
    Pool,
    PoolInstance,
    PoolManager,
    PoolMove,
    PoolRequest,
    TokenIntervalMonitor,
    create_pool_manager,
    pool_manager_class,
)
from laxflow.integrations.prefill.base import TtftPredictor

# The engine role each pool runs (decode14's ``instances.instance.ROLES``).
ROLE_OF = {Pool.PREFILL: "prefill", Pool.D_TO_P: "prefill", Pool.DECODE: "decode", Pool.P_TO_D: "decode"}
POOL_OF_ROLE = {"prefill": Pool.PREFILL, "decode": Pool.DECODE}

# Sequences of this context fill the profiled decode batch that sets Max Running
# Tokens (Arrow §5.3); decode step time is nearly a function of total context,
# so the choice barely matters. Same value for every workload.
PROFILE_CONTEXT = 1024


@dataclass(frozen=True)
class PoolsConfig:
    """The driver's own knobs (the manager's are ``ArrowConfig``); the same for every workload.

    ``monitor_period``: seconds between ``rebalance`` calls (Arrow's cluster
    monitor period is not published; 1 s is 10 x the largest Table 1 TPOT
    SLO, so the one flip a call may make shows in the token intervals of the
    next period). ``monitor_window``: token gaps averaged per instance.
    """

    monitor_period: float = 1.0
    monitor_window: int = 32

    def __post_init__(self) -> None:
        if not (isinstance(self.monitor_period, (int, float)) and math.isfinite(self.monitor_period)
                and self.monitor_period > 0):
            raise UserError(f"pools: monitor_period: expected seconds > 0, got {self.monitor_period!r}")
        if isinstance(self.monitor_window, bool) or not isinstance(self.monitor_window, int) or self.monitor_window < 1:
            raise UserError(f"pools: monitor_window: expected an integer >= 1, got {self.monitor_window!r}")


class PoolTable:
    """Instance id -> pool; every change goes through :meth:`apply` (checked) and is logged."""

    def __init__(self, pools: dict[str, Pool]) -> None:
        self.pools = dict(pools)
        self.flips: list[tuple[float, PoolMove]] = []  # (time, move), for metrics and tests

    def apply(self, move: PoolMove, now: float) -> None:
        if self.pools.get(move.instance) is not move.src:
            raise RuntimeError(f"pool move of {move.instance} from {move.src.value}: it is in "
                               f"{getattr(self.pools.get(move.instance), 'value', None)}")
        self.pools[move.instance] = move.dst
        self.flips.append((now, move))

    def count(self, pool: Pool) -> int:
        return sum(1 for p in self.pools.values() if p is pool)


def ttft_profile(engine: Any, scheduler: Any, max_tokens: int, points: int = 16) -> list[tuple[float, float]]:
    """(prompt tokens, TTFT alone) on one idle instance: the local scheduler's own chunks, timed by the
    engine's compute model (Arrow's startup profile; its quadratic fit is the TTFT predictor)."""
    from laxflow.integrations.prefill.iteration import SequenceView

    out = []
    for n in sorted({max(1, round(max_tokens * k / (points - 1))) for k in range(points)}):
        view, secs = SequenceView("profile", 0.0, 1e9, 1e9, n), 0.0
        while view.is_prefill:
            batch = scheduler.schedule([view], 0.0, None)
            if not batch.entries:
                raise RuntimeError(f"pools: the local scheduler ran nothing for a lone {n}-token prompt")
            entry = batch.entries[0]
            secs += engine.timer.seconds([(entry.new_tokens, view.context)])
            view = view.after(entry)
        out.append((float(n), secs))
    return out


def max_running_tokens(engine: Any, kv_capacity: int, tpot_slo: float) -> int:
    """Arrow §5.3's profiled Max Running Tokens: the tokens one instance's KV holds, capped by the
    largest decode batch (sequences of ``PROFILE_CONTEXT`` tokens) whose step fits the TPOT SLO."""
    lo, hi = 1, max(1, -(-kv_capacity // PROFILE_CONTEXT))
    if engine.timer.seconds([(1, PROFILE_CONTEXT)]) > tpot_slo:
        return PROFILE_CONTEXT
    while lo < hi:  # largest batch size b with step(b) <= tpot_slo
        mid = (lo + hi + 1) // 2
        if engine.timer.seconds([(1, PROFILE_CONTEXT)] * mid) <= tpot_slo:
            lo = mid
        else:
            hi = mid - 1
    return max(1, min(kv_capacity, lo * PROFILE_CONTEXT))


class PoolDispatcher:
    """The engine's dispatcher for one pool manager; built by :func:`attach_pools` (one per run)."""

    def __init__(self, manager: PoolManager, predictor: TtftPredictor, pools: dict[str, Pool], tpot_slo: float,
                 config: PoolsConfig = PoolsConfig()) -> None:
        self.manager = manager
        self.tpot_slo = tpot_slo  # the cluster's TPOT SLO, the monitor's threshold (§5.5 case 2)
        self.predictor = predictor  # the same fit the manager uses: work done on a partial prompt
        self.table = PoolTable(pools)
        self.config = config
        self.monitors = {iid: TokenIntervalMonitor(config.monitor_window) for iid in pools}
        self.next_rebalance = 0.0
        self.rebalances = 0

    # -- snapshot ------------------------------------------------------------------------
    def instance_view(self, inst: Any) -> PoolInstance:
        prefills = [s for s in inst.seqs.values() if s.is_prefill]
        decodes = [s for s in inst.seqs.values() if not s.is_prefill]
        return PoolInstance(
            inst.id, self.table.pools[inst.id],
            queued_prefill_tokens=tuple(s.prompt_tokens for s in prefills),
            # Chunked prefill runs several prompts at once: what is done is the predicted work of
            # every computed part, so the manager's delay is the predicted work still to run.
            prefill_elapsed=sum(self.predictor(s.computed) for s in prefills if s.computed > 0),
            running_tokens=sum(s.prompt_tokens + s.outputs for s in decodes),
            decoding=len(decodes),
            # Gaps describe the decode batch that produced them; with none resident they are stale.
            avg_token_interval=self.monitors[inst.id].average() if decodes else 0.0,
        )

    def snapshot(self, engine: Any) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self.instance_view(i) for i in engine.instances.values()))

    # -- moves ---------------------------------------------------------------------------
    def _apply(self, engine: Any, moves: tuple[PoolMove, ...] | list[PoolMove], now: float) -> None:
        for m in moves:
            self.table.apply(m, now)
            role = ROLE_OF[m.dst]
            if engine.instances[m.instance].role != role:
                engine.set_role(m.instance, role)

    def _settle(self, engine: Any, inst: Any, now: float) -> None:
        """Figure 5's completion edges, as soon as the step that drained the old work ends."""
        pool = self.table.pools[inst.id]
        if pool is Pool.P_TO_D and not any(s.is_prefill for s in inst.seqs.values()):
            self._apply(engine, [PoolMove(inst.id, pool, Pool.DECODE)], now)
        elif pool is Pool.D_TO_P and not any(not s.is_prefill for s in inst.seqs.values()):
            self._apply(engine, [PoolMove(inst.id, pool, Pool.PREFILL)], now)

    # -- the engine's dispatcher calls --------------------------------------------------------
    @staticmethod
    def _request(seq: Any) -> PoolRequest:
        return PoolRequest(seq.id, seq.arrival, seq.prompt_tokens, seq.ttft_slo, seq.tpot_slo, seq.prefill_instance)

    def prefill_target(self, engine: Any, seq: Any, now: float) -> str:
        decision = self.manager.dispatch_prefill(self._request(seq), self.snapshot(engine), now)
        self._apply(engine, decision.moves, now)
        return decision.instance

    def decode_target(self, engine: Any, seq: Any, now: float) -> str:
        decision = self.manager.dispatch_decode(self._request(seq), self.snapshot(engine), now)
        self._apply(engine, decision.moves, now)
        return decision.instance

    def after_step(self, engine: Any, inst: Any, now: float) -> None:
        monitor = self.monitors[inst.id]
        # A step that leaves decodes resident emitted their tokens (or the first token of a prompt it
        # finished): a token gap. With no decode left the instance idles; that gap is no slow token.
        if inst.decoding() > 0:
            monitor.record(now)
        else:
            monitor.idle()
        self._settle(engine, inst, now)
        if now >= self.next_rebalance:
            self.next_rebalance = now + self.config.monitor_period
            self.rebalances += 1
            self._apply(engine, self.manager.rebalance(self.snapshot(engine), now, self.tpot_slo), now)

    # -- results -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Flip counts and the final pools, for the run's result.

        ``flips_p2d``: instances the manager turned from prefill to decode work (P or D->P into
        P->D or D); ``flips_d2p`` the reverse. Figure 5's completion edges (P->D -> D, D->P -> P)
        are no decision and count in neither; ``pool_flips`` counts every table change.
        """
        kinds: dict[str, int] = {}
        to_decode = to_prefill = 0
        for _, m in self.table.flips:
            key = f"{m.src.value}>{m.dst.value}"
            kinds[key] = kinds.get(key, 0) + 1
            if m.src in PREFILL_POOLS and m.dst in DECODE_POOLS:
                to_decode += 1
            elif m.src in DECODE_POOLS and m.dst in PREFILL_POOLS:
                to_prefill += 1
        return {"pool_flips": len(self.table.flips), "pool_flip_kinds": kinds, "flips_p2d": to_decode,
                "flips_d2p": to_prefill, "pools_end": {p.value: self.table.count(p) for p in Pool},
                "rebalances": self.rebalances}

    def result_keys(self) -> dict[str, Any]:
        """What a run's metrics row carries from the pools (``run.py``): the flip counts, final split."""
        st = self.stats()
        end = st["pools_end"]
        split = f"{len(self.table.pools)} colocated" if self.manager.colocated else \
            f"{end['P'] + end['D->P']}:{end['D'] + end['P->D']}"
        return {"flips_p2d": st["flips_p2d"], "flips_d2p": st["flips_d2p"], "pools_end": split}


def attach_pools(engine: Any, name: str, prefill_instances: int, options: dict[str, Any] | None = None,
                 config: PoolsConfig = PoolsConfig()) -> PoolDispatcher:
    """Build pool manager ``name`` for ``engine`` and make it the engine's dispatcher.

    The first ``prefill_instances`` instances (engine order) start in P, the rest in D, and their
    roles are set to match. Profiles (Arrow §5.3, once per run, from the engine's compute model):
    the TTFT predictor over the local prefill scheduler, and ``max_running_tokens`` unless given.
    """
    ids = list(engine.instances)
    try:
        colocated = pool_manager_class(name).colocated
    except ValueError as exc:
        raise UserError(f"--pools {name}: {exc}") from None
    if colocated:  # no P/D split: every instance in P (it never moves), each running mixed batches
        pools = {iid: Pool.PREFILL for iid in ids}
    elif not 1 <= prefill_instances < len(ids):
        raise UserError(f"--pools {name}: needs at least one prefill and one decode instance to start from, "
                        f"got {prefill_instances} prefill of {len(ids)} instances")
    else:
        pools = {iid: (Pool.PREFILL if k < prefill_instances else Pool.DECODE) for k, iid in enumerate(ids)}
    for iid, pool in pools.items():
        role = "colocated" if colocated else ROLE_OF[pool]
        if engine.instances[iid].role != role:
            engine.set_role(iid, role)
    first = engine.instances[ids[0]]
    top = max(max(s.prompt for s in engine.seqs), 2)
    samples = ttft_profile(engine, first.schedulers["prefill"], top)
    opts = dict(options or {})
    tpot = min(s.tpot_slo for s in engine.seqs)
    if "max_running_tokens" not in opts:
        opts["max_running_tokens"] = max_running_tokens(engine, first.kv_capacity, tpot)
    try:
        manager = create_pool_manager(name, samples, **opts)
    except ValueError as exc:
        raise UserError(f"--pools {name}: {exc}") from None
    dispatcher = PoolDispatcher(manager, TtftPredictor(samples, degree=2), pools, tpot, config)
    engine.dispatcher = dispatcher
    return dispatcher
