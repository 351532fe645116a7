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
    idx, new = admit(p, flows, snap.capacity)
    facts = t.facts
    fs = [facts[s] for s in idx]  # (explicit, stage, link, rate, weight, batch, request, target, due)
    remaining = snap.remaining.tolist()
    _measure(p, snap, idx, fs, new, remaining)

    tick = t.tick(now)
    thresholds = p._q_ascending
    urg, layer_at, tick_at = t.urgency, t.layer_at, t.tick_at
    us = [0] * len(idx)  # urgency per flow after this decision
    for i in new:
        s = idx[i]
        c = flows[i].current_layer
        cur = _NAN if c is None else float(c)
        u = _candidate(p, snap, fs[i], i, cur, remaining, thresholds)
        us[i] = u
        urg[s] = u
        layer_at[s] = _NO_LAYER if cur != cur else cur  # NaN: no layer known
        tick_at[s] = tick
        if p.flow_notes:
            flows[i].state["rmlq_level"] = queue_of_one(u, fs[i][0], k)
    for i, s in enumerate(idx):
        if new and i in new:
            continue
        urgency = us[i] = int(urg[s])
        if urgency <= 0:
            continue
        f = flows[i]
        c = f.current_layer
        current = _NAN if c is None else float(c)
        cur = _NO_LAYER if current != current else current
        explicit = fs[i][0]
        if not (cur > layer_at[s] or (explicit and f.compute_done and tick > tick_at[s])):
            continue
        u = min(urgency, _candidate(p, snap, fs[i], i, current, remaining, thresholds))
        us[i] = u
        urg[s] = u
        layer_at[s] = cur
        tick_at[s] = tick
        if u < urgency and p.flow_notes:
            f.state["rmlq_level"] = queue_of_one(u, explicit, k)

    if p._order_stale:
        p._reorder(snap)
    pruned, rank = p._pruned, p._rank
    keys: list[tuple[int, int, int, int]] = []
    timer = None
    for i, (fa, u) in enumerate(zip(fs, us)):
        explicit = fa[0]
        if pruned[fa[6]] and fa[1] != _COLLECTIVE:
            keys.append((k, 0, 0, 0))  # arbitration.engine_levels: the scavenger is one level
            continue
        # queue_of_one, then arbitration.engine_levels' key (queue, explicit, RLI, RED rank), made dense.
        if explicit:
            keys.append((u, 1, 0, 0))
            if timer is None and u > 0 and flows[i].compute_done:
                timer = (tick + 1) * t.period
        else:
            q = u + 1 if u + 1 < k - 1 else k - 1
            keys.append((q, 0, u, int(rank[fa[5]])))
    last_rem = t.last_rem
    for s, r in zip(idx, remaining):
        last_rem[s] = r
    keyset = tuple(keys)
    out = p._few_out.get(keyset)
    if out is None:
        out = _arrays(p, keys)
        if len(p._few_out) >= 4096:  # bounded: keys hold RED ranks, which keep growing
            p._few_out.clear()
        p._few_out[keyset] = out
    return Decision(level=out[0], queue=out[1], dscp=out[2], timers=() if timer is None else (timer,))


def _arrays(p: MfsPolicy, keys: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(level, queue, dscp) of a decision from its flows' arbitration keys; read-only,
    as the same arrays are handed out again for the same keys."""
    dense = {key: r for r, key in enumerate(sorted(set(keys)))}
    level = np.array([dense[key] for key in keys], np.int64)
    queue = np.array([key[0] for key in keys], np.int64)
    dscp = p._dscp_codes[queue]
    for a in (level, queue, dscp):
        a.flags.writeable = False
    return level, queue, dscp


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


def admit(p: MfsPolicy, flows: list[Flow], capacity: np.ndarray) -> tuple[list[int], list[int]]:
    """The RMLQ slots of ``flows`` in order, new flows admitted (slots in
    snapshot order first, then their facts, as every path does), and the
    positions of the new ones (the scalar and native paths)."""
    t = p.rmlq
    idx = list(map(t.slot.get, flows))
    new = [i for i, s in enumerate(idx) if s is None] if None in idx else []
    if new:
        for i in new:
            idx[i] = t.allocate(flows[i])
        for i in new:
            _admit_one(p, flows[i], idx[i], capacity)
    return idx, new


def admission_facts(p: MfsPolicy, flows: list[Flow], capacity: np.ndarray) -> list[tuple]:
    """New flows' ``Rmlq.facts``, in order: (explicit, stage, bottleneck link,
    rate and weight there, batch index, request index, target layer, due
    time; NaN: none), the flows entered in the policy's batch and request
    tables. Shared by the scalar and native paths' admission (hundreds of
    thousands of flows per run: a plain Flow's fields are read directly, as
    its ``due`` and ``has_explicit_deadline`` compute them)."""
    out = []
    p2d, codes = Stage.P2D, STAGE_CODES
    for f, (b, r) in zip(flows, p._enter_many(flows)):
        link, rate, weight = bottleneck(p, f, capacity)
        layer = f.layer
        target = _NAN if layer is None else float(layer)
        if type(f) is Flow:
            d, kind = f.deadline, f.stage
            due = _NAN if d is None else float(d - f.downstream)
            out.append((kind is p2d and d is not None, codes[kind], link, rate, weight, b, r, target, due))
        else:
            due = _NAN if (d := f.due) is None else float(d)  # (a subclass may define its own)
            out.append((f.has_explicit_deadline, codes[f.stage], link, rate, weight, b, r, target, due))
    return out


def _admit_one(p: MfsPolicy, f: Flow, s: int, capacity: np.ndarray) -> None:
    """Static facts of a new flow (``MfsPolicy._admit`` for one flow), in the arrays and ``rmlq.facts``."""
    t = p.rmlq
    facts = t.facts[s] = admission_facts(p, [f], capacity)[0]
    explicit, stage, link, rate, weight, b, r, target, due = facts
    t.bneck_link[s] = link
    t.bneck_rate[s] = rate
    t.bneck_weight[s] = weight
    t.last_rem[s] = f.size
    t.explicit[s] = explicit
    t.stage[s] = stage
    t.target[s] = target
    t.due[s] = due
    t.batch[s] = b
    t.request[s] = r


def _ratio(capacity: float, weight: float) -> float:
    """capacity / weight as NumPy divides (a zero weight gives inf, not an error)."""
    if weight == 0.0:
        return math.copysign(math.inf, capacity) if capacity else _NAN
    return capacity / weight


def _candidate(
    p: MfsPolicy, snap: Snapshot, facts: tuple, i: int, current: float, remaining: list[float], thresholds: list[float]
) -> int:
    """Urgency flow i (static ``facts``: ``Rmlq.facts`` of its slot) would have now:
    its MLU level, or its RLI (``MfsPolicy._candidates``)."""
    explicit, stage, link, rate, _, _, _, target, due = facts
    if not explicit:
        k = p.config.levels
        if stage == _COLLECTIVE:
            return 0
        if stage == _P2D:
            return k - 1
        diff = target - current
        return k - 1 if math.isnan(diff) else int(min(max(diff, 0.0), k - 1))
    rho = float(snap.link_load[link]) - float(p._explicit_load[link])
    rho = min(max(rho, 0.0), 1.0)
    residual = (due - snap.now) * rate * (1.0 - rho)
    m = remaining[i] / residual if residual > 0 else math.inf
    if m > 1.0:
        p.infeasible.add(snap.flows[i].id)
        snap.flows[i].state["infeasible"] = True
    return len(thresholds) - bisect_right(thresholds, m)


def _measure(
    p: MfsPolicy, snap: Snapshot, idx: list[int], fs: list[tuple], new: list[int], remaining: list[float]
) -> None:
    """``MfsPolicy._measure_explicit_load`` flow by flow, over the links that moved
    (``new``: positions of flows admitted now, which moved nothing yet)."""
    interval = p._measure_interval(snap)
    if interval is None:
        return
    last, now = interval
    last_rem = p.rmlq.last_rem
    sent: dict[int, float] = {}
    for i, (s, fa) in enumerate(zip(idx, fs)):
        if fa[0] and not (new and i in new):
            link = fa[2]
            # np.bincount adds each flow's bytes in order, starting from 0.0.
            sent[link] = sent.get(link, 0.0) + (float(last_rem[s]) - remaining[i]) * fa[4]
    p._advance_explicit_load(snap, now - last, sent)
