"""The incremental path of :meth:`MfsPolicy.decide`: work only where something changed.

A serving run keeps a few hundred flows live under MFS (strict priority
starves the lower levels), and between two decisions almost nothing about
them changes: a flow or two arrives or finishes, one request crosses a
layer, a period tick passes. The from-scratch paths (``mfs_scalar`` and the
vectorized one in ``mfs``) redo every step for every live flow at every
decision. This path keeps, across decisions, the live flows in snapshot
order with their RMLQ slots, the ``current_layer`` / ``compute_done`` it last
read, and each flow's arbitration key, and re-evaluates only

* flows that arrived (entry level),
* flows whose request's ``current_layer`` or ``compute_done`` changed, and
  explicit flows past compute once a new period tick began (promotion),
* flows whose batch's RED rank or whose request's pruning changed (key),

then turns the live keys into dense levels through a small key -> level
table. Why skipping the rest is exact: after every decision, each live flow
that can still climb has ``layer_at >= `` the layer read then, and each
explicit flow past compute has ``tick_at`` = that decision's tick (it was
either re-evaluated, which sets both, or not eligible, which means exactly
that), so with unchanged inputs it is not eligible now either. Every float
operation that remains (explicit-load average, MLU) is the scalar path's,
in the same order: decisions and policy state are bit-identical to a
from-scratch evaluation; ``tests/policy`` replays recorded runs through
every path and compares.

The snapshot must list the flows of the last decision that are still live
in the same order, new flows after them (the network engine's admission
order; the daemon's message table). Anything else (an owner that reorders)
rebuilds the kept state from the snapshot: slower, never wrong.

Called only by ``MfsPolicy.decide`` / ``on_complete`` / ``set_order``, on
the engine's (or daemon's) thread.
"""

from __future__ import annotations

import math
from itertools import compress
from operator import attrgetter, ne
from typing import TYPE_CHECKING

import numpy as np

from laxflow.policy.arbitration import queue_of_one
from laxflow.policy.base import Decision, Snapshot
from laxflow.policy.flow import STAGE_CODES, Flow, Stage
from laxflow.policy.mfs_scalar import _admit_one, _candidate

if TYPE_CHECKING:
    from laxflow.policy.mfs import MfsPolicy

_NAN = float("nan")
_NO_LAYER = -math.inf
_COLLECTIVE = STAGE_CODES[Stage.COLLECTIVE]
_current = attrgetter("current_layer")
_compute_done = attrgetter("compute_done")


class LiveView:
    """What the incremental path keeps between decisions (one per policy)."""

    def __init__(self) -> None:
        self.key_id = np.full(64, -1, np.int64)  # per RMLQ slot: arbitration key id, -1 for none
        self.queue = np.zeros(64, np.int64)  # per RMLQ slot: RMLQ queue (K = scavenger)
        self.keys: dict[tuple[int, int, int, int], list[int]] = {}  # key -> [id, live flows with it]
        self.key_of: list = []  # key id -> key (None: free)
        self.free_ids: list[int] = []
        self.active = False  # the last decision was this path's
        self.reset()

    def reset(self) -> None:
        """Forget everything but the (slot-indexed) arrays' sizes: the next decision starts from its snapshot."""
        self.seq: list[Flow] = []  # live flows in snapshot order (last decision's, minus finished)
        self.slots: list[int] = []  # their RMLQ slots, aligned with seq
        self.slot_array: np.ndarray | None = np.zeros(0, np.int64)  # slots as an array (None: stale)
        self.current: list = []  # current_layer as last read, aligned with seq
        self.done: list = []  # compute_done as last read, aligned with seq
        self.gone: list[Flow] = []  # finished since the last decision
        # Slots of explicit flows past compute with urgency > 0: re-evaluated at every new period tick.
        self.ticking: set[int] = set()
        self.key_id[:] = -1
        self.keys.clear()
        self.key_of.clear()
        self.free_ids.clear()
        self.remap: np.ndarray | None = None  # key id -> dense level; None when keys came or went
        self.tick: int | None = None  # period tick of the last decision
        self.out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # last level, queue, dscp
        self.explicit: tuple | None = None  # explicit flows' positions, slots, weights, links (None: stale)
        self.rekey_all = False  # every key must be recomputed (set_order changed pruning)

    def forget(self, flow: Flow, s: int) -> None:
        """A live flow (slot ``s``) finished; called by ``MfsPolicy.on_complete`` before its slot is released."""
        self.gone.append(flow)
        self.ticking.discard(s)
        if s < len(self.key_id) and self.key_id[s] >= 0:
            self._release(int(self.key_id[s]))
            self.key_id[s] = -1

    def fit(self, slots: int) -> None:
        """Grow the per-slot arrays to the RMLQ's size."""
        if len(self.key_id) < slots:
            grow = slots - len(self.key_id)
            self.key_id = np.concatenate([self.key_id, np.full(grow, -1, np.int64)])
            self.queue = np.concatenate([self.queue, np.zeros(grow, np.int64)])

    def _release(self, kid: int) -> None:
        key = self.key_of[kid]
        entry = self.keys[key]
        entry[1] -= 1
        if not entry[1]:
            del self.keys[key]
            self.key_of[kid] = None
            self.free_ids.append(kid)
            self.remap = None

    def set_key(self, s: int, key: tuple[int, int, int, int], queue: int) -> None:
        """Flow at slot ``s`` now has arbitration ``key`` and RMLQ ``queue``."""
        self.queue[s] = queue
        old = int(self.key_id[s])
        entry = self.keys.get(key)
        if entry is not None and entry[0] == old:
            return
        if entry is None:
            if self.free_ids:
                kid = self.free_ids.pop()
                self.key_of[kid] = key
            else:
                kid = len(self.key_of)
                self.key_of.append(key)
            entry = self.keys[key] = [kid, 0]
            self.remap = None
        entry[1] += 1
        if old >= 0:
            self._release(old)
        self.key_id[s] = entry[0]

    def levels(self, rank: np.ndarray) -> np.ndarray:
        """Key id -> dense level (0 first) over the keys live flows hold, batches
        ordered by ``rank`` (the policy's RED rank per batch); equal orders share a level."""
        if self.remap is None:
            remap = [0] * max(len(self.key_of), 1)
            order = sorted(
                ((q, e, u, 0 if b < 0 else int(rank[b])), kid) for (q, e, u, b), (kid, _) in self.keys.items()
            )
            level, last = -1, None
            for key, kid in order:
                if key != last:
                    level, last = level + 1, key
                remap[kid] = level
            self.remap = np.array(remap, np.int64)
        return self.remap


def decide_incremental(p: MfsPolicy, snap: Snapshot) -> Decision:
    """``MfsPolicy.decide`` for a snapshot with at least one flow, from the kept :class:`LiveView`."""
    t, v = p.rmlq, p._view
    k = p.config.levels
    now = snap.now
    flows = snap.flows if isinstance(snap.flows, list) else list(snap.flows)
    n = len(flows)
    if not v.active:  # the last decision was from scratch: start from this snapshot
        v.reset()
    v.active = True
    # 1. Drop the flows that finished since the last decision.
    if v.gone:
        seq = v.seq
        pos = []
        for f in v.gone:
            try:
                pos.append(seq.index(f))
            except ValueError:
                pass
        v.gone = []
        if pos:
            pos.sort(reverse=True)
            for i in pos:
                del seq[i], v.slots[i], v.current[i], v.done[i]
            v.slot_array = v.out = v.explicit = None
    # 2. The snapshot must be those flows in the same order, new ones after.
    m = len(v.seq)
    if n < m or flows[:m] != v.seq:
        v.reset()
        m = 0
    slot = t.slot
    added = [slot.get(f, -1) for f in flows[m:]]
    new_pos = [m + j for j, s in enumerate(added) if s < 0]
    known_pos = [m + j for j, s in enumerate(added) if s >= 0]  # only after a rebuild
    for i in new_pos:  # slots in snapshot order first, then the facts (as the other paths)
        added[i - m] = t.allocate(flows[i])
    for i in new_pos:
        _admit_one(p, flows[i], added[i - m], snap.capacity)
    if added:
        v.fit(len(t.urgency))
        v.seq.extend(flows[m:])
        v.slots.extend(added)
        v.slot_array = v.out = v.explicit = None
    slots = v.slots
    if v.slot_array is None:
        v.slot_array = np.array(slots, np.int64)
    slot_array = v.slot_array
    # 3. Request state: which flows' current layer or compute_done changed.
    current = list(map(_current, flows))
    done = list(map(_compute_done, flows))
    v.current.extend(current[m:])
    v.done.extend(done[m:])
    touched: set[int] = set(known_pos)
    if current != v.current:
        touched.update(compress(range(n), map(ne, current, v.current)))
    if done != v.done:
        touched.update(compress(range(n), map(ne, done, v.done)))
    v.current, v.done = current, done
    remaining = snap.remaining
    _measure(p, snap, v, new_pos, remaining)

    # 4. Entry levels and promotions, only where something can have changed.
    tick = t.tick(now)
    if tick != v.tick and v.ticking:
        touched.update(compress(range(n), map(v.ticking.__contains__, slots)))
    v.tick = tick
    thresholds = p._q_ascending
    rem = None
    rekey: list[int] = list(known_pos)
    for i in new_pos:
        if rem is None:
            rem = remaining.tolist()
        s = slots[i]
        c = current[i]
        cur = _NAN if c is None else float(c)
        facts = t.facts[s]
        u = _candidate(p, snap, facts, i, cur, rem, thresholds)
        explicit = facts[0]
        t.urgency[s] = u
        t.layer_at[s] = _NO_LAYER if math.isnan(cur) else cur
        t.tick_at[s] = tick
        if p.flow_notes:
            flows[i].state["rmlq_level"] = queue_of_one(u, explicit, k)
        if explicit and done[i] and u > 0:
            v.ticking.add(s)
        rekey.append(i)
    for i in sorted(touched):
        s = slots[i]
        urgency = int(t.urgency[s])
        facts = t.facts[s]
        explicit = facts[0]
        compute_done = bool(done[i])
        if explicit and compute_done and urgency > 0:
            v.ticking.add(s)
        else:
            v.ticking.discard(s)
            if urgency <= 0:
                continue
        c = current[i]
        cur = _NAN if c is None else float(c)
        layer = _NO_LAYER if math.isnan(cur) else cur
        periodic = explicit and compute_done and tick > t.tick_at[s]
        if not (layer > t.layer_at[s] or periodic):
            continue
        if rem is None:
            rem = remaining.tolist()
        u = min(urgency, _candidate(p, snap, facts, i, cur, rem, thresholds))
        t.urgency[s] = u
        t.layer_at[s] = layer
        t.tick_at[s] = tick
        if u < urgency:
            if p.flow_notes:
                flows[i].state["rmlq_level"] = queue_of_one(u, explicit, k)
            if u <= 0:
                v.ticking.discard(s)
            rekey.append(i)

    # 5. RED order and pruning; their changes re-key the flows of the batches and requests involved.
    if p._order_stale:
        prunes = not p._external and p.config.drop_budget > 0  # else _reorder leaves _pruned alone
        pruned = p._pruned.copy() if prunes else None
        if p._reorder(snap):
            v.remap = v.out = None  # keys name batches; their order is read when levels are made
        if pruned is not None:
            flipped = pruned != p._pruned
            if flipped.any():
                rekey.extend(np.flatnonzero(flipped[t.request[slot_array]]).tolist())
    if v.rekey_all:
        v.rekey_all = False
        rekey = range(n)  # type: ignore[assignment]
    if rekey:
        _rekey(p, slots, rekey)
        v.out = None

    # 6. The decision: levels from the key table; timer if an explicit flow past compute can still climb.
    t.last_rem[slot_array] = remaining
    if v.out is None or v.remap is None:
        level = v.levels(p._rank)[v.key_id[slot_array]]
        queue = v.queue[slot_array]
        dscp = p._dscp_codes[queue]
        for a in (level, queue, dscp):  # handed out again while nothing changes: nobody may edit them
            a.flags.writeable = False
        v.out = (level, queue, dscp)
    level, queue, dscp = v.out
    timer = None
    if v.ticking:
        # Explicit flows are p2d: in the scavenger exactly when their request is pruned.
        pruned_now, request = p._pruned, t.request
        if any(not pruned_now[request[s]] for s in v.ticking):
            timer = (tick + 1) * t.period
    return Decision(level=level, queue=queue, dscp=dscp, timers=() if timer is None else (timer,))


def _rekey(p: MfsPolicy, slots: list[int], positions) -> None:
    """Recompute the arbitration key (queue, explicit, RLI, RED rank) of flows at ``positions``."""
    t, v = p.rmlq, p._view
    k = p.config.levels
    pruned = p._pruned
    facts, urgency = t.facts, t.urgency
    for i in positions:
        s = slots[i]
        u = int(urgency[s])
        explicit, stage, _, _, _, batch, request, _, _ = facts[s]
        if pruned[request] and stage != _COLLECTIVE:
            q = k
        else:
            q = queue_of_one(u, explicit, k)
        # arbitration.engine_levels orders by (queue, explicit, RLI, RED rank of the
        # batch); the key names the batch (-1: not ordered by it), LiveView.levels ranks.
        fine = not explicit and q < k
        key = (q, int(explicit and q < k), u if fine else 0, batch if fine else -1)
        v.set_key(s, key, q)


def _measure(p: MfsPolicy, snap: Snapshot, v: LiveView, new_pos: list[int], remaining: np.ndarray) -> None:
    """``MfsPolicy._measure_explicit_load``: bytes the live explicit flows moved, per
    bottleneck link, added in snapshot order from 0.0 (as np.bincount does)."""
    t = p.rmlq
    interval = p._measure_interval(snap)
    if interval is None:
        return
    last, now = interval
    if v.explicit is None or new_pos:
        slot_array = v.slot_array
        if new_pos and new_pos[0] == len(slot_array) - len(new_pos):  # new flows are the tail (no rebuild)
            explicit = t.explicit[slot_array[: new_pos[0]]]
        else:
            explicit = t.explicit[slot_array]
            if new_pos:  # not moved yet; counted from the next decision (so not kept)
                explicit[new_pos] = False
        e = explicit.nonzero()[0]  # (np.flatnonzero's result, without its Python wrapper)
        es = v.slot_array[e]
        entry = (e, es, t.bneck_weight[es], t.bneck_link[es].tolist())
        if not new_pos:
            v.explicit = entry
    else:
        entry = v.explicit
    e, es, weight, links = entry
    sent: dict[int, float] = {}
    if links:
        moved = ((t.last_rem[es] - remaining[e]) * weight).tolist()
        for link, x in zip(links, moved):
            sent[link] = sent.get(link, 0.0) + x
    p._advance_explicit_load(snap, now - last, sent)
