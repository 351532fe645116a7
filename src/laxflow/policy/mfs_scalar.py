"""The few-flow path of :meth:`MfsPolicy.decide`: the same steps, one flow at a time.

A serving run's decisions see 1-3 live flows at the median, where a NumPy
call costs more than the arithmetic it does; ``MfsPolicy.decide`` hands
snapshots of at most :data:`FEW_FLOWS` flows to :func:`decide_few`, which
runs the steps of the vectorized path (admission, explicit-load average,
entry levels, promotion, arbitration, timers) on Python floats. Each float
operation is the one the vectorized path does, in the same order, so both
paths give bit-identical state and decisions; the regression test replays
recorded serving runs through each path and compares every decision.

Called only by ``MfsPolicy.decide``, on the engine's (or daemon's) thread.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING

import numpy as np

from laxflow.policy.arbitration import queue_of_one
from laxflow.policy.base import Decision, Snapshot
from laxflow.policy.flow import STAGE_CODES, Flow, Stage

if TYPE_CHECKING:
    from laxflow.policy.mfs import MfsPolicy

# Up to this many live flows the scalar path is faster (measured break-even
# ~50 with every flow at a layer boundary, its worst case).
FEW_FLOWS = 48
_NAN = float("nan")
_NO_LAYER = -math.inf
_COLLECTIVE = STAGE_CODES[Stage.COLLECTIVE]
_P2D = STAGE_CODES[Stage.P2D]


def decide_few(p: MfsPolicy, snap: Snapshot) -> Decision:
    """``MfsPolicy.decide`` for a snapshot with a few flows (at least one)."""
    t = p.rmlq
    flows = snap.flows
    now = snap.now
    k = p.config.levels
    slot = t.slot
    idx = [slot.get(f, -1) for f in flows]
    new = [i for i, s in enumerate(idx) if s < 0]
    for i, s in zip(new, [t.allocate(flows[i]) for i in new]):
        idx[i] = s
    for i in new:
        _admit_one(p, flows[i], idx[i], snap.capacity)
    current = [_NAN if (c := f.current_layer) is None else float(c) for f in flows]
    remaining = snap.remaining.tolist()
    is_new = [False] * len(flows)
    for i in new:
        is_new[i] = True
    _measure(p, snap, idx, is_new, remaining)

    tick = t.tick(now)
    thresholds = p._q_ascending
    for i in new:
        s = idx[i]
        u = _candidate(p, snap, s, i, current[i], remaining, thresholds)
        t.urgency[s] = u
        t.layer_at[s] = _NO_LAYER if math.isnan(current[i]) else current[i]
        t.tick_at[s] = tick
        flows[i].state["rmlq_level"] = queue_of_one(u, t.explicit[s], k)
    for i, s in enumerate(idx):
        if is_new[i]:
            continue
        urgency = int(t.urgency[s])
        if urgency <= 0:
            continue
        cur = _NO_LAYER if math.isnan(current[i]) else current[i]
        explicit = bool(t.explicit[s])
        periodic = explicit and flows[i].compute_done and tick > t.tick_at[s]
        if not (cur > t.layer_at[s] or periodic):
            continue
        u = min(urgency, _candidate(p, snap, s, i, current[i], remaining, thresholds))
        t.urgency[s] = u
        t.layer_at[s] = cur
        t.tick_at[s] = tick
        if u < urgency:
            flows[i].state["rmlq_level"] = queue_of_one(u, explicit, k)

    if p._order_stale:
        p._reorder(snap)
    pruned, rank = p._pruned, p._rank
    queues: list[int] = []
    keys: list[tuple[int, int, int, int]] = []
    timer = None
    for i, s in enumerate(idx):
        u = int(t.urgency[s])
        explicit = bool(t.explicit[s])
        if pruned[t.request[s]] and t.stage[s] != _COLLECTIVE:
            q = k
        else:
            q = queue_of_one(u, explicit, k)
        queues.append(q)
        # arbitration.engine_levels: (queue, explicit, RLI, RED rank), dense.
        fine = not explicit and q < k
        keys.append((q, int(explicit and q < k), u if fine else 0, int(rank[t.batch[s]]) if fine else 0))
        if timer is None and explicit and q < k and u > 0 and flows[i].compute_done:
            timer = (tick + 1) * t.period
    dense = {key: r for r, key in enumerate(sorted(set(keys)))}
    last_rem = t.last_rem
    for s, r in zip(idx, remaining):
        last_rem[s] = r
    queue = np.array(queues, np.int64)
    return Decision(
        level=np.array([dense[key] for key in keys], np.int64),
        queue=queue,
        dscp=p._dscp_codes[queue],
        timers=() if timer is None else (timer,),
    )


def bottleneck(p: MfsPolicy, f: Flow, capacity: np.ndarray) -> tuple[int, float, float]:
    """The flow's bottleneck alone: (first link attaining the min of capacity /
    weight, that min, the flow's weight there).

    Read-only usage arrays (the serving simulator's transfer shapes, shared
    by every flow of a shape) are looked up in ``p._bneck_cache`` by identity;
    the entry keeps the arrays alive, so an id is never reused for others."""
    links_a, weights_a = f.links, f.weights
    frozen = not (links_a.flags.writeable or weights_a.flags.writeable)
    if frozen:
        hit = p._bneck_cache.get((id(links_a), id(weights_a)))
        if hit is not None and hit[2] is capacity:
            return hit[3]
    links = links_a.tolist()
    weights = weights_a.tolist()
    cap = capacity[links_a].tolist()
    per_link = [_ratio(c, w) for c, w in zip(cap, weights)]
    best = min(per_link)
    first = per_link.index(best)  # first link attaining the min
    out = (links[first], best, weights[first])
    if frozen:
        if len(p._bneck_cache) >= 4096:  # bounded: many distinct frozen arrays is not the serving case
            p._bneck_cache.clear()
        p._bneck_cache[(id(links_a), id(weights_a))] = (links_a, weights_a, capacity, out)
    return out


def _admit_one(p: MfsPolicy, f: Flow, s: int, capacity: np.ndarray) -> None:
    """Static facts of a new flow (``MfsPolicy._admit`` for one flow)."""
    t = p.rmlq
    t.bneck_link[s], t.bneck_rate[s], t.bneck_weight[s] = bottleneck(p, f, capacity)
    t.last_rem[s] = f.size
    t.explicit[s] = f.has_explicit_deadline
    t.stage[s] = STAGE_CODES[f.stage]
    t.target[s] = _NAN if f.layer is None else f.layer
    t.due[s] = _NAN if (d := f.due) is None else d
    p._register(f, s)


def _ratio(capacity: float, weight: float) -> float:
    """capacity / weight as NumPy divides (a zero weight gives inf, not an error)."""
    if weight == 0.0:
        return math.copysign(math.inf, capacity) if capacity else _NAN
    return capacity / weight


def _candidate(
    p: MfsPolicy, snap: Snapshot, s: int, i: int, current: float, remaining: list[float], thresholds: list[float]
) -> int:
    """Urgency flow i (slot s) would have now: its MLU level, or its RLI (``MfsPolicy._candidates``)."""
    t = p.rmlq
    k = p.config.levels
    if not t.explicit[s]:
        stage = t.stage[s]
        if stage == _COLLECTIVE:
            return 0
        if stage == _P2D:
            return k - 1
        diff = float(t.target[s]) - current
        return k - 1 if math.isnan(diff) else int(min(max(diff, 0.0), k - 1))
    link = int(t.bneck_link[s])
    rho = float(snap.link_load[link]) - float(p._explicit_load[link])
    rho = min(max(rho, 0.0), 1.0)
    residual = (float(t.due[s]) - snap.now) * float(t.bneck_rate[s]) * (1.0 - rho)
    m = remaining[i] / residual if residual > 0 else math.inf
    if m > 1.0:
        p.infeasible.add(snap.flows[i].id)
        snap.flows[i].state["infeasible"] = True
    return len(thresholds) - bisect_right(thresholds, m)


def _measure(p: MfsPolicy, snap: Snapshot, idx: list[int], is_new: list[bool], remaining: list[float]) -> None:
    """``MfsPolicy._measure_explicit_load`` flow by flow, over the links that moved."""
    t = p.rmlq
    interval = p._measure_interval(snap)
    if interval is None:
        return
    last, now = interval
    sent: dict[int, float] = {}
    for i, s in enumerate(idx):
        if t.explicit[s] and not is_new[i]:
            link = int(t.bneck_link[s])
            # np.bincount adds each flow's bytes in order, starting from 0.0.
            sent[link] = sent.get(link, 0.0) + (float(t.last_rem[s]) - remaining[i]) * float(t.bneck_weight[s])
    p._advance_explicit_load(snap, now - last, sent)
