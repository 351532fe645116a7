"""Continuous Defer-and-Promote (``dp-ideal``): the paper's Table 1-2 ideal.

What MFS approximates with K discrete levels and layer-boundary promotion,
done exactly (MFS §3.2, Table 2(d)):

* ``p2d`` flows with a deadline wait at the lowest level until their laxity
  ``due - now - remaining / B`` reaches zero (``B``: the bottleneck capacity
  of their path alone), then run at the top level and stay there: they
  finish just in time.
* ``collective`` flows go above ``reuse`` flows (they block compute now).
* ``reuse`` flows (and ``p2d`` flows without a deadline) by RLI
  (``layer - current_layer``; unknown = last), then due time.

Levels: 0 promoted p2d, 1 collectives, then one level per distinct (RLI,
due) of the rest, and deferred p2d flows last. The promotion time is found
with timers: normally ``now + laxity`` (the earliest laxity can hit zero, if
the flow gets no bandwidth); when nothing but the policy's own timer changed
since the last decision, the flow's measured rate over the last interval is
also its rate for the next one, and the exact zero crossing
``now + laxity / (1 - rate / B)`` is used, so a deferred flow that runs at
full rate does not wake the engine over and over. Called by the engine after
every event; a reference policy, not tuned for speed.
"""

from __future__ import annotations

import numpy as np

from laxflow.policy.base import Decision, FlowPolicy, Snapshot, rank_levels
from laxflow.policy.dscp import DscpMap
from laxflow.policy.flow import STAGE_CODES, Flow, Stage

_COLLECTIVE = STAGE_CODES[Stage.COLLECTIVE]
_P2D = STAGE_CODES[Stage.P2D]
# Laxity at or below this (s, relative to the due time's magnitude) counts as zero.
_ZERO_LAXITY = 1e-9


class DeferAndPromoteIdeal(FlowPolicy):
    """Exact Defer-and-Promote on a fluid network."""

    name = "dp-ideal"
    reads_link_load = False

    def __init__(self, dscp: DscpMap | None = None) -> None:
        super().__init__(dscp)
        self._promoted: set[Flow] = set()
        self._last: tuple[float, list[Flow], np.ndarray, np.ndarray] | None = None

    def decide(self, snap: Snapshot) -> Decision:
        n = len(snap.flows)
        now = snap.now
        bneck = snap.bottleneck_rate
        explicit = snap.explicit
        due = snap.due
        laxity = due - now - snap.remaining / bneck
        tol = _ZERO_LAXITY * np.maximum(1.0, np.abs(np.nan_to_num(due)))
        promoted = np.fromiter((f in self._promoted for f in snap.flows), bool, n)
        newly = explicit & ~promoted & (laxity <= tol)
        for i in np.flatnonzero(newly):
            self._promoted.add(snap.flows[i])
        promoted |= newly
        deferred = explicit & ~promoted

        target = snap.column("layer")
        current = snap.column("current_layer")
        rli = np.clip(np.nan_to_num(target - current, nan=np.inf), 0, None)
        rli[snap.stage == _P2D] = np.inf  # p2d without a deadline blocks nothing: after every reuse flow
        cls = np.full(n, 2, np.int64)
        cls[promoted] = 0
        cls[(snap.stage == _COLLECTIVE) & ~explicit] = 1
        cls[deferred] = 3
        fine = cls == 2
        level = rank_levels([np.where(fine, np.nan_to_num(due, nan=np.inf), 0.0), np.where(fine, rli, 0.0), cls])

        timers = self._timers(snap, deferred, laxity, bneck, level)
        self._last = (now, list(snap.flows), snap.remaining.copy(), level)
        return self.decision(level, timers=timers)

    def _timers(self, snap: Snapshot, deferred: np.ndarray, laxity: np.ndarray, bneck: np.ndarray, level: np.ndarray) -> tuple[float, ...]:
        if not deferred.any():
            return ()
        wait = laxity[deferred]
        last = self._last
        steady = (
            last is not None
            and snap.now > last[0]
            and len(last[1]) == len(snap.flows)
            and all(a is b for a, b in zip(last[1], snap.flows))
            and np.array_equal(last[3], level)
        )
        if steady:
            # Same flows, same levels: the allocation, hence every rate, is unchanged.
            rate = (last[2] - snap.remaining)[deferred] / (snap.now - last[0])
            slope = 1.0 - np.clip(rate / bneck[deferred], 0.0, 1.0)
            with np.errstate(divide="ignore"):
                wait = np.where(slope > 1e-12, wait / slope, np.inf)
        t = float(np.min(wait))
        return (snap.now + t,) if np.isfinite(t) else ()

    def on_complete(self, flow: Flow, now: float) -> None:
        self._promoted.discard(flow)
