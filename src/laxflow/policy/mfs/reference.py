"""The MFS state and decision step in Python and NumPy: the reference.

:class:`Reference` keeps everything MFS keeps (the RMLQ slot table
:class:`~laxflow.policy.rmlq.Rmlq`, the batch and request tables, RED per
live batch, the explicit-load average per link) and decides for all live
flows at once, vectorized. :class:`~laxflow.policy.mfs.MfsPolicy` runs it
when the C core (``core.c``, ``laxflow.policy.mfs._core.Core``, the same
interface) is not built, and the tests hold the core to it decision by
decision (``tests/policy/test_mfs_native_reference.py``,
``test_mfs_regression.py``): the core does these float operations in this
order. Called by the policy on the caller's one thread.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

from laxflow.policy.arbitration import engine_levels, queue_of
from laxflow.policy.base import Decision, Snapshot
from laxflow.policy.flow import STAGE_CODES, Flow, Stage
from laxflow.policy.mlu import level_of, mlu
from laxflow.policy.rli import rli
from laxflow.policy.rmlq import Rmlq

_NAN = float("nan")
_COLLECTIVE = STAGE_CODES[Stage.COLLECTIVE]
_LAST = np.iinfo(np.int64).max // 2  # the rank of a batch not ordered yet


class Reference:
    """MFS's per-flow, batch, request and link state, and its decision step.

    Built from ``MfsConfig``'s ``levels``, ``period``, ``load_window``
    (``window``) and whether ``drop_budget`` prunes (``prunes``), the MLU
    ``thresholds`` (:func:`laxflow.policy.mlu.thresholds`) and the DSCP
    code per queue (``dscp``). ``red(deadlines)`` gives a tuple of deadlines' RED; ``reorder(snap)`` is
    called inside :meth:`decide` when the batches' order is stale (it ranks
    them with :meth:`set_ranks` and prunes with :meth:`prune`);
    ``notes(flows, noted, bad)`` at the end of a decision that has some:
    ``noted`` flat (position, RMLQ level) pairs (only while
    :attr:`note_levels`), ``bad`` positions of explicit flows found with
    MLU > 1.
    """

    def __init__(self, levels: int, period: float, window: float, prunes: bool, thresholds: np.ndarray,
                 dscp: np.ndarray, red: Callable[[tuple[float, ...]], float], reorder: Callable[[Snapshot], None],
                 notes: Callable[[Sequence[Flow], list[int], list[int]], None]) -> None:
        self._levels, self._window, self._prunes, self._q = levels, window, prunes, thresholds
        self._red, self._reorder, self._notes = red, reorder, notes
        self._codes = dscp  # queue -> DSCP, index K = scavenger
        self.note_levels = True
        self._t = Rmlq(levels, period)
        # Batch and request tables (index -> name / facts), grown on first sight;
        # indices forget() freed are handed out again first.
        self._batch_index: dict[str, int] = {}
        self._batch_names: list[str | None] = []
        self._rank = np.zeros(16, np.int64)  # RED rank per batch index
        self._request_index: dict[str, int] = {}
        self._request_names: list[str | None] = []
        self._request_deadline: list[float] = []
        self._request_batch: list[int] = []  # -1: named by set_pruned only
        self._pruned = np.zeros(16, bool)  # per request index
        self._free_batches: list[int] = []
        self._free_requests: list[int] = []
        self._batch_requests: dict[int, list[int]] = {}  # each batch's requests (freed with it)
        self._forget_pending: set[str] = set()  # batches forget() named while they had live flows
        self._unbatched: set[int] = set()  # requests set_pruned named that no flow joined to a batch yet
        # Live batch -> its live flows' count, in the order the batches became
        # live; and -> request index -> its live flows' count, in the order they came.
        self._live_flows: dict[int, int] = {}
        self._live_requests: dict[int, dict[int, int]] = {}
        self._order_stale = True
        # A live batch's RED changed since the last reorder (one of its
        # requests came or went): a departure must then re-rank the rest.
        self._red_moved = False
        self._external = False  # set_pruned was called: a coordinator orders and prunes
        self._explicit_load = np.zeros(0)  # moving average of explicit traffic per link (mlu.py: rho)
        self._finished_bytes = np.zeros(0)  # explicit bytes of flows done since the last decision
        self._finished_links: set[int] = set()  # where _finished_bytes is not 0
        self._last_t: float | None = None
        # A batch's live requests (indices, in the order they came) -> RED;
        # RED per live batch, dropped whenever its live requests change.
        self._red_by_requests: dict[tuple[int, ...], float] = {}
        self._batch_red: dict[int, float] = {}
        # The batches the last full reorder ranked (live then, or gone but
        # remembered: a batch leaves and comes back at each of its layers),
        # with the RED each was ranked by; and the batches that became live or
        # whose live requests changed since. See _ranks_hold.
        self._ranked_red: dict[int, float] = {}
        self._touched: set[int] = set()

    # ------------------------------------------------------------ decision

    def decide(self, snap: Snapshot) -> Decision:
        """Levels, queues, DSCP and the period timer of ``snap``'s flows (see
        ``MfsPolicy``): admission, the explicit-load average, order, entry
        levels and promotions, arbitration. Every flow's progress is read (an
        incremental snapshot's ``progressed`` and ``tag`` say no more than
        the flows do); ``tag`` is the flows' RMLQ slots."""
        flows = snap.flows
        n = len(flows)
        if n == 0:
            empty = np.zeros(0, np.int64)
            return Decision(level=empty, queue=empty, dscp=np.zeros(0, np.uint8))
        if len(snap.remaining) != n:
            raise ValueError(f"mfs: Snapshot.remaining has {len(snap.remaining)} values for {n} flows")
        now, t = snap.now, self._t
        slot = t.slot
        idx = np.fromiter([slot.get(f, -1) for f in flows], np.int64, n)
        new_pos = np.flatnonzero(idx < 0)
        if new_pos.size:
            idx[new_pos] = self._admit([flows[i] for i in new_pos.tolist()], snap.capacity)
        current = np.fromiter((_NAN if (c := f.current_layer) is None else c for f in flows), float, n)
        compute_done = np.fromiter((f.compute_done for f in flows), bool, n)
        is_new = np.zeros(n, bool)
        is_new[new_pos] = True
        self._measure_explicit_load(snap, idx, is_new)
        if self._order_stale:
            self._order_stale = self._red_moved = False
            if self._external or self._prunes or not self._ranks_hold():
                self._reorder(snap)
        noted: list[int] = []
        bad: list[int] = []
        if new_pos.size:
            pos = new_pos
            t.set_entry(idx[pos], self._candidates(idx[pos], pos, snap, current, bad), current[pos], now)
            self._note(noted, pos, idx[pos])
        pos = np.flatnonzero(~is_new)
        if pos.size:
            pos = pos[t.eligible(idx[pos], current[pos], compute_done[pos], now)]
            if pos.size:
                changed = t.promote(idx[pos], self._candidates(idx[pos], pos, snap, current, bad), current[pos], now)
                self._note(noted, pos[changed], idx[pos[changed]])
        explicit, urgency = t.explicit[idx], t.urgency[idx]
        queue = queue_of(urgency, explicit, self._scavenged(idx), self._levels)
        level = engine_levels(queue, explicit, urgency, self._rank[t.batch[idx]], self._levels)
        timer = t.next_timer(idx, compute_done & (queue < self._levels), now)
        t.last_rem[idx] = snap.remaining
        if noted or bad:
            self._notes(flows, noted, bad)
        return Decision(level=level, queue=queue, dscp=self._codes[queue],
                              timers=() if timer is None else (timer,), tag=None if snap.tag is None else idx)

    def _admit(self, new: list[Flow], capacity: np.ndarray) -> np.ndarray:
        """Slots for newly seen flows (all first, in order), with their static facts and batch and request."""
        t = self._t
        slots = np.fromiter((t.allocate(f) for f in new), np.int64, len(new))
        t.batch[slots] = -1  # (until admitted: a flow whose admission raised completes as nothing)
        t.explicit[slots] = False
        for f, s in zip(new, slots.tolist()):
            t.bneck_link[s], t.bneck_rate[s], t.bneck_weight[s] = bottleneck(f, capacity)
        t.last_rem[slots] = np.fromiter((f.size for f in new), float, len(new))
        t.explicit[slots] = np.fromiter((f.has_explicit_deadline for f in new), bool, len(new))
        t.stage[slots] = np.fromiter((STAGE_CODES[f.stage] for f in new), np.int8, len(new))
        t.target[slots] = np.fromiter((_NAN if f.layer is None else f.layer for f in new), float, len(new))
        t.due[slots] = np.fromiter((_NAN if (d := f.due) is None else d for f in new), float, len(new))
        for f, s in zip(new, slots.tolist()):
            t.batch[s], t.request[s] = self._enter(f)
        return slots

    def _enter(self, f: Flow) -> tuple[int, int]:
        """A new flow in the batch and request tables and the live ones: its (batch, request) indices."""
        b = self._batch_index.get(f.batch)
        if b is None:
            b = self._batch_slot(f.batch)
        r = self._request_index.get(f.request)
        if r is None or self._request_batch[r] < 0:
            r = self._request_slot(f.request, _NAN if f.deadline is None else f.deadline, b)
        count = self._live_flows.get(b)
        if count is None:  # the batch is live (again): its rank is Algorithm 1's to give
            count = 0
            self._live_requests[b] = {}
            self._touched.add(b)
            self._order_stale = True
        self._live_flows[b] = count + 1
        requests = self._live_requests[b]
        count = requests.get(r)
        if count is None:
            requests[r] = 1
            self._batch_red.pop(b, None)  # its live deadlines changed
            self._touched.add(b)
            self._red_moved = True
        else:
            requests[r] = count + 1
        return b, r

    def _batch_slot(self, name: str) -> int:
        if self._free_batches:
            b = self._free_batches.pop()
            self._batch_names[b] = name
        else:
            b = len(self._batch_names)
            self._batch_names.append(name)
        self._batch_index[name] = b
        if b >= len(self._rank):
            self._rank = np.concatenate([self._rank, np.zeros(len(self._rank), np.int64)])
        self._rank[b] = _LAST
        self._order_stale = True
        return b

    def _request_slot(self, name: str, deadline: float, batch: int) -> int:
        r = self._request_index.get(name)
        if r is None:
            if self._free_requests:  # (its pruned flag is False)
                r = self._free_requests.pop()
                self._request_names[r] = name
                self._request_deadline[r] = deadline
                self._request_batch[r] = batch
            else:
                r = len(self._request_names)
                self._request_names.append(name)
                self._request_deadline.append(deadline)
                self._request_batch.append(batch)
            self._request_index[name] = r
            if r >= len(self._pruned):
                self._pruned = np.concatenate([self._pruned, np.zeros(len(self._pruned), bool)])
            self._order_stale = True
            if batch >= 0:
                self._batch_requests.setdefault(batch, []).append(r)
            else:
                self._unbatched.add(r)
        elif batch >= 0 and self._request_batch[r] < 0:  # first named by set_pruned
            self._request_deadline[r] = deadline
            self._red_by_requests.clear()
            self._request_batch[r] = batch
            self._batch_requests.setdefault(batch, []).append(r)
            self._unbatched.discard(r)
        return r

    def _measure_explicit_load(self, snap: Snapshot, idx: np.ndarray, is_new: np.ndarray) -> None:
        """Advance the explicit-traffic moving average over [last decision, now]:
        ``load <- u + (load - u) * exp(-dt / window)``, u the utilization by the
        bytes explicit flows sent since their last decision (and those of
        explicit flows done meanwhile) on each one's bottleneck link."""
        links = len(snap.capacity)
        if self._explicit_load.size != links:  # (the network's link count changed: start over at 0)
            self._explicit_load, self._finished_bytes = np.zeros(links), np.zeros(links)
            self._finished_links.clear()
        last, now = self._last_t, snap.now
        self._last_t = now
        if last is None or now <= last:
            return
        t, dt, window = self._t, now - last, self._window
        moved = t.explicit[idx] & ~is_new
        if not self._finished_links and not moved.any():  # no explicit bytes moved: the average only decays
            self._explicit_load *= math.exp(-dt / window)
            return
        sent = (t.last_rem[idx[moved]] - snap.remaining[moved]) * t.bneck_weight[idx[moved]]
        per_link = np.bincount(t.bneck_link[idx[moved]], weights=sent, minlength=links) + self._finished_bytes
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            util = per_link / (snap.capacity * dt)
        # A utilization is in [0, 1]; a vanishing interval or float dust must not say otherwise.
        util = np.clip(np.nan_to_num(util, nan=0.0, posinf=1.0), 0.0, 1.0)
        self._explicit_load = util + (self._explicit_load - util) * math.exp(-dt / window)
        self._finished_bytes[:] = 0.0
        self._finished_links.clear()

    def _candidates(self, idx: np.ndarray, pos: np.ndarray, snap: Snapshot, current: np.ndarray,
                    bad: list[int]) -> np.ndarray:
        """Urgency the flows at slots ``idx`` (snapshot positions ``pos``) would
        have now: MLU level if explicit (against the link load less MFS's own
        explicit traffic), RLI otherwise; the infeasible ones' positions into ``bad``."""
        t = self._t
        out = rli(t.target[idx], current[pos], t.stage[idx], self._levels)
        exp = t.explicit[idx]
        if not exp.any():
            return out
        e_idx = idx[exp]
        link = t.bneck_link[e_idx]
        in_use = snap.link_load_in_use if snap.tag is not None else None
        load = snap.link_load[link] if in_use is None else np.clip(in_use[link], 0.0, 1.0)
        m = mlu(snap.remaining[pos][exp], t.due[e_idx] - snap.now, t.bneck_rate[e_idx], load - self._explicit_load[link])
        out[exp] = level_of(m, self._q)
        bad.extend(pos[np.flatnonzero(exp)[m > 1.0]].tolist())
        return out

    def _note(self, noted: list[int], pos: np.ndarray, idx: np.ndarray) -> None:
        """(position, RMLQ level) of the flows whose level was set, into ``noted`` (while :attr:`note_levels`)."""
        if pos.size and self.note_levels:
            t = self._t
            q = queue_of(t.urgency[idx], t.explicit[idx], np.zeros(idx.size, bool), self._levels)
            for i, lv in zip(pos.tolist(), q.tolist()):
                noted += (i, lv)

    def _scavenged(self, idx: np.ndarray) -> np.ndarray:
        """Which flows (slots) the scavenger class takes: a pruned request's own
        flows. A collective is the batch's, not its tag request's: demoting it
        would stall the batch's un-pruned requests, so pruning spares it."""
        t = self._t
        return self._pruned[t.request[idx]] & (t.stage[idx] != _COLLECTIVE)

    # ------------------------------------------------------------ completion, tables

    def complete(self, flow: Flow) -> None:
        """``flow`` finished: its slot is free, its explicit bytes since the last
        decision count on its bottleneck link, and its batch and request leave
        the live tables with their last flow (a batch departure reorders when a
        live batch's RED moved since the last reorder, or by a coordinator, or
        with pruning; else the ranks keep the departed batch's gap)."""
        t = self._t
        s = t.release(flow)
        if s is None:
            return
        b = int(t.batch[s])
        if b < 0:  # its admission raised
            return
        if t.explicit[s] and self._finished_bytes.size:
            link = int(t.bneck_link[s])
            self._finished_bytes[link] += t.last_rem[s] * t.bneck_weight[s]
            self._finished_links.add(link)
        left = self._live_flows[b] - 1
        self._live_flows[b] = left
        r = int(t.request[s])
        requests = self._live_requests[b]
        count = requests[r] - 1
        if count:
            requests[r] = count
            return
        del requests[r]
        self._batch_red.pop(b, None)  # its live deadlines changed
        self._touched.add(b)
        if left:
            self._red_moved = True
            return
        del self._live_flows[b]
        del self._live_requests[b]
        if self._red_moved or self._external or self._prunes:
            self._order_stale = True

    def forget(self, batches: Iterable[str]) -> list[str]:
        """Free the table entries of ``batches`` and their requests (``MfsPolicy.forget``);
        the names of the batches freed now. A batch with live flows is freed
        at a later call, once they completed; requests named by
        :meth:`set_pruned` that joined no batch and are not pruned are freed
        too; names never seen are ignored."""
        pending = self._forget_pending
        pending.update(batches)
        freed, freed_requests = [], False
        for name in list(pending):
            b = self._batch_index.get(name)
            if b is None:
                pending.discard(name)
                continue
            if b in self._live_flows:  # still has live flows: at a later call
                continue
            pending.discard(name)
            freed.append(name)
            del self._batch_index[name]
            self._batch_names[b] = None
            self._free_batches.append(b)
            self._ranked_red.pop(b, None)
            self._batch_red.pop(b, None)
            self._touched.discard(b)
            for r in self._batch_requests.pop(b, ()):
                self._free_request(r)
                freed_requests = True
        for r in [r for r in self._unbatched if not self._pruned[r]]:
            self._free_request(r)
            freed_requests = True
        if freed_requests:  # (the memo's keys could name a reused index)
            self._red_by_requests.clear()
        return freed

    def _free_request(self, r: int) -> None:
        """Request index ``r`` freed, handed out again later; kept, as another
        live batch's, while a live batch holds it."""
        for b, requests in self._live_requests.items():
            if r in requests:
                self._request_batch[r] = b
                self._batch_requests.setdefault(b, []).append(r)
                return
        self._unbatched.discard(r)
        del self._request_index[self._request_names[r]]
        self._request_names[r] = None
        self._request_deadline[r] = _NAN
        self._request_batch[r] = -1
        self._pruned[r] = False
        self._free_requests.append(r)

    # ------------------------------------------------------------ order and pruning (the wrapper's)

    def set_pruned(self, names: Iterable[str]) -> None:
        """A coordinator's pruned requests: from now on it orders and prunes;
        every pruned flag is cleared, then set for ``names`` (a name not seen
        yet gets a request entry that its first flow joins to a batch)."""
        self._external = True
        self._pruned[:] = False
        for name in names:
            r = self._request_slot(name, _NAN, -1)  # (may grow _pruned: indexed after)
            self._pruned[r] = True
        self._order_stale = True

    def prune(self, names: Iterable[str]) -> None:
        """Algorithm 1's result: these known requests are pruned."""
        for name in names:
            self._pruned[self._request_index[name]] = True

    def pruned_names(self) -> set[str]:
        return {self._request_names[i] for i in np.flatnonzero(self._pruned[: len(self._request_names)])}

    def live_batches(self) -> list[tuple[float, str, int]]:
        """(RED, name, index) of each live batch, in the order they became live."""
        names = self._batch_names
        return [(self._red_of(b), names[b], b) for b in self._live_flows]

    def gone_batches(self) -> list[tuple[float, str, int]]:
        """(RED it was ranked by, name, index) of each batch the last full reorder ranked that is not live now."""
        names, live = self._batch_names, self._live_flows
        return [(red, names[b], b) for b, red in self._ranked_red.items() if b not in live]

    def deadlines(self, b: int) -> list[float]:
        """Live batch ``b``'s live requests' deadlines, in the order they came (none left out but NaN)."""
        return [d for r in self._live_requests[b] if not math.isnan(d := self._request_deadline[r])]

    def batch_index(self, name: str) -> int | None:
        return self._batch_index.get(name)

    def set_ranks(self, ranked: list[tuple[int, int]], ranked_red: dict[int, float] | None) -> bool:
        """rank[b] = k for each (b, k); ``ranked_red`` (not None) is the last full
        reorder's (batch -> RED). Whether a live batch's rank changed."""
        rank, live = self._rank, self._live_flows
        item, moved = rank.item, False  # (a Python int: cheaper than rank[b] and its NumPy comparison)
        for b, k in ranked:
            if item(b) != k:
                rank[b] = k
                moved = moved or b in live
        if ranked_red is not None:
            self._ranked_red = ranked_red
        self._touched.clear()
        return moved

    def owners(self, flows: Iterable[Flow]) -> list[tuple[int, int, str, float, bool] | None]:
        """Per flow: (batch index, request index, request name, its deadline (NaN:
        none), whether it is pruned), or None for a flow without a slot."""
        t, out = self._t, []
        for f in flows:
            s = t.slot.get(f)
            if s is None or t.batch[s] < 0:  # (or its admission raised)
                out.append(None)
                continue
            r = int(t.request[s])
            out.append((int(t.batch[s]), r, self._request_names[r], self._request_deadline[r], bool(self._pruned[r])))
        return out

    def _ranks_hold(self) -> bool:
        """Whether the ranks the last full reorder wrote still order the live
        batches as a full reorder would: true when every batch that became live
        or whose live requests changed since is gone again or was ranked then
        with the RED it has now (batches that left only leave gaps)."""
        ranked, live = self._ranked_red, self._live_flows
        for b in self._touched:
            if b in live and ranked.get(b) != self._red_of(b):
                return False
        self._touched.clear()
        return True

    def _red_of(self, b: int) -> float:
        """Live batch ``b``'s RED, memoized for ``b`` and by its live requests (a
        batch leaves and comes back with the same ones at each of its layers)."""
        red = self._batch_red.get(b)
        if red is None:
            requests = tuple(self._live_requests[b])
            red = self._red_by_requests.get(requests)
            if red is None:
                red = self._red(tuple(self.deadlines(b)))
                if len(self._red_by_requests) >= 4096:  # bounded: requests finish and never come back
                    self._red_by_requests.clear()
                self._red_by_requests[requests] = red
            self._batch_red[b] = red
        return red

    # ------------------------------------------------------------ reading

    def level(self, flow: Flow, pruning: bool) -> int:
        """RMLQ level of a live flow (K = scavenger): with pruning applied, or as promotion left it."""
        idx = np.array([self._t.slot[flow]])
        scavenged = self._scavenged(idx) if pruning else np.zeros(1, bool)
        return int(queue_of(self._t.urgency[idx], self._t.explicit[idx], scavenged, self._levels)[0])

    def sizes(self) -> dict[str, int]:
        """Table sizes, free entries included (for tests)."""
        return {"slots": self._t.allocated, "batches": len(self._batch_names),
                "requests": len(self._request_names), "live_batches": len(self._live_flows),
                "red_memo": len(self._red_by_requests)}


def bottleneck(f: Flow, capacity: np.ndarray) -> tuple[int, float, float]:
    """A flow's bottleneck alone: (first link attaining the min of capacity /
    weight, that min, the flow's weight there)."""
    links, weights = f.links.tolist(), f.weights.tolist()
    for link in links:
        if not 0 <= link < len(capacity):
            raise ValueError(f"mfs: flow {f.id!r} uses link {link}, but the network has {len(capacity)} links")
    per_link = [_ratio(c, w) for c, w in zip(capacity[f.links].tolist(), weights)]
    best = min(per_link)
    first = per_link.index(best)
    return links[first], best, weights[first]


def _ratio(capacity: float, weight: float) -> float:
    """capacity / weight as NumPy divides (a zero weight gives inf, not an error)."""
    if weight == 0.0:
        return math.copysign(math.inf, capacity) if capacity else _NAN
    return capacity / weight
