"""The KV-cache-aware global router and the prefix caches it reads.

Called by the simulator once per request, at its arrival. In the spirit of
Dynamo's KV router: every prefill unit is scored by the prefix blocks it would
still have to obtain (not cached on it) plus the blocks already queued on it,
and the cheapest wins (ties: lowest unit index, so runs are deterministic).
A prefix cached on *another* unit is not recomputed: the chosen unit fetches
those blocks remotely (stage 1). The decode unit is the one with the fewest
KV tokens in residence.

Caches hold block hashes (a block's hash chains its whole prefix, so a match
of block i implies blocks 0..i-1); capacity is LRU per unit, in tokens. When
a batch's compute ends, its unit stores the prompts' blocks, and where they
live is the KV placement (``ServingConfig.kv_placement``):

* ``pool`` (the MFS paper's setting, §2.2): a block lives only on the unit
  that first computed it, as in a Mooncake-style store spread over the
  prefill units. A request reuses the leading run of its blocks held
  anywhere, and fetches each remote block from its owner; it keeps no copy.
  A hot prefix therefore stays on one "victim unit" that every reader
  fetches from, while that unit's own all-to-alls share its NICs.
* ``local-cache``: every unit that computes or fetches a block keeps it, so
  a request fetches the part of its longest cached prefix (one holder) that
  its own unit lacks, and hot prefixes end up copied everywhere.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence


class PrefixCaches:
    """The prefix caches of all prefill units, with a global hash -> holders index."""

    def __init__(self, num_units: int, capacity_tokens: int, placement: str = "local-cache") -> None:
        self.capacity_tokens = capacity_tokens
        self.placement = placement
        # per unit: block hash -> attention-DP rank whose GPUs hold it
        self._lru: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(num_units)]
        self._holders: dict[int, set[int]] = {}
        self.evicted = 0  # blocks dropped by LRU, counted (never silent)

    def prefix_lengths(self, hashes: Sequence[int]) -> dict[int, int]:
        """Blocks of ``hashes``' leading run cached on each unit (units with 0 left out)."""
        lengths: dict[int, int] = {}
        alive: set[int] | None = None
        for i, h in enumerate(hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for u in alive:
                lengths[u] = i + 1
        return lengths

    def owners(self, hashes: Sequence[int]) -> list[int]:
        """Pool placement: the owner of each block of ``hashes``' leading run held anywhere."""
        out: list[int] = []
        for h in hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            out.append(min(holders))
        return out

    def insert(self, unit: int, hashes: Sequence[int], block_size: int, rank: int = 0) -> None:
        """Store ``hashes`` computed on ``unit`` (most recently used), evicting LRU blocks past capacity.

        With ``pool`` placement a block already held elsewhere is not copied.
        """
        lru = self._lru[unit]
        pool = self.placement == "pool"
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            if pool and self._holders.get(h):
                continue
            lru[h] = rank
            self._holders.setdefault(h, set()).add(unit)
        while len(lru) * block_size > self.capacity_tokens:
            old, _ = lru.popitem(last=False)
            holders = self._holders[old]
            holders.discard(unit)
            if not holders:
                del self._holders[old]
            self.evicted += 1

    def touch(self, unit: int, hashes: Sequence[int]) -> None:
        """Mark reused blocks as recently used on ``unit``."""
        lru = self._lru[unit]
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)

    def rank_of(self, unit: int, block: int) -> int:
        """Attention-DP rank of ``unit`` that holds ``block`` (0 if it is not held there)."""
        return self._lru[unit].get(block, 0)


@dataclass(frozen=True)
class Route:
    """Where one request runs and what it reuses (in tokens)."""

    prefill: int  # prefill unit index
    decode: int  # decode unit index
    local_tokens: int  # prefix tokens cached on the prefill unit itself
    remote_tokens: int  # further prefix tokens fetched from other units (stage 1)
    holder: int | None  # unit sending the most fetched tokens, when remote_tokens > 0
    fetches: tuple[tuple[int, int, int], ...] = ()  # (holder unit, its attention-DP rank, tokens), by unit

    @property
    def reused_tokens(self) -> int:
        return self.local_tokens + self.remote_tokens


class GlobalRouter:
    """Picks the prefill unit (prefix overlap + queue load) and the decode unit (load)."""

    def __init__(self, num_prefill: int, num_decode: int, caches: PrefixCaches, overlap_weight: float,
                 remote_reuse: float | None = None) -> None:
        self.num_prefill = num_prefill
        self.num_decode = num_decode
        self.caches = caches
        self.overlap_weight = overlap_weight
        # ServingConfig.remote_reuse: None, or the chance a request is sent away from its prefix's main
        # holder (see _steer). One coin per routed request from a fixed stream: requests arrive in the same
        # order under every policy, so each request gets the same coin whatever the policy.
        self.remote_reuse = remote_reuse
        self._coin = random.Random(0)
        # Network-aware dispatch (ServingConfig.router_dispatch "ttft"): set by the simulator before each
        # route(); (unit, prefix blocks cached there) -> estimated TTFT s, replacing the load cost.
        self.ttft_cost: Callable[[int, int], float] | None = None

    def route(
        self,
        hashes: Sequence[int],
        block_size: int,
        input_tokens: int,
        queued_tokens: Sequence[int],
        decode_tokens: Sequence[float],
    ) -> Route:
        """Route one request.

        ``queued_tokens[u]`` are the new tokens waiting or running on prefill
        unit u; ``decode_tokens[d]`` the KV tokens resident on decode unit d.
        At least one token is always computed (the one that yields the first
        token), so a fully cached prompt still reuses at most input - 1 tokens.
        """
        blocks = len(hashes)
        max_reuse = max(0, input_tokens - 1)
        decode = min(range(self.num_decode), key=lambda d: (decode_tokens[d], d))
        if self.caches.placement == "pool":
            owners = self.caches.owners(hashes)
            mine: dict[int, int] = {}
            for o in owners:
                mine[o] = mine.get(o, 0) + 1
            best = self._steer(self._cheapest(blocks, mine, queued_tokens, block_size), mine, queued_tokens)
            per: dict[int, int] = {}
            first: dict[int, int] = {}  # owner -> its first block here (whose rank holds the run)
            reused = 0
            for i, o in enumerate(owners):  # leading run, capped so one token is always computed
                take = min(block_size, max_reuse - reused)
                if take <= 0:
                    break
                per[o] = per.get(o, 0) + take
                first.setdefault(o, hashes[i])
                reused += take
            local = per.pop(best, 0)
            fetches = tuple((o, self.caches.rank_of(o, first[o]), n) for o, n in sorted(per.items()))
            remote = sum(f[2] for f in fetches)
            holder = max(fetches, key=lambda f: (f[2], -f[0]))[0] if fetches else None
            return Route(best, decode, local, remote, holder, fetches)
        lengths = self.caches.prefix_lengths(hashes)
        best = self._steer(self._cheapest(blocks, lengths, queued_tokens, block_size), lengths, queued_tokens)
        local = min(lengths.get(best, 0) * block_size, max_reuse)
        holder, global_blocks = None, 0
        for u, n in sorted(lengths.items()):
            if n > global_blocks:
                holder, global_blocks = u, n
        remote = max(0, min(global_blocks * block_size, max_reuse) - local)
        if remote <= 0:
            return Route(best, decode, local, 0, None)
        rank = self.caches.rank_of(holder, hashes[0])
        return Route(best, decode, local, remote, holder, ((holder, rank, remote),))

    def _steer(self, best: int, cached: dict[int, int], queued_tokens: Sequence[int]) -> int:
        """``best``, or with ``remote_reuse`` set: with that chance the least-loaded unit other than the one
        holding most of the prefix (its reuse is then fetched remotely), else that holder (reuse local).

        A knob for ``laxflow sim map``'s share of reuse fetched remotely, in place of the router's own
        trade-off between prefix overlap and load; without a cached prefix the router's choice stands.
        """
        if self.remote_reuse is None:
            return best
        coin = self._coin.random()  # drawn for every request, so the stream stays aligned across policies
        if not cached:
            return best
        holder = max(sorted(cached), key=lambda u: cached[u])  # most blocks; ties: lowest index
        if coin >= self.remote_reuse or self.num_prefill == 1:
            return holder
        return min((u for u in range(self.num_prefill) if u != holder), key=lambda u: (queued_tokens[u], u))

    def _cheapest(self, blocks: int, cached: dict[int, int], queued_tokens: Sequence[int], block_size: int) -> int:
        """Unit with the fewest (blocks not cached there) x weight + queued blocks; ties: lowest index."""
        best, best_cost = 0, float("inf")
        for u in range(self.num_prefill):
            if self.ttft_cost is not None:
                cost = self.ttft_cost(u, cached.get(u, 0))
                if cost < best_cost:
                    best, best_cost = u, cost
                continue
            cost = self.overlap_weight * (blocks - cached.get(u, 0)) + queued_tokens[u] / block_size
            if cost < best_cost:
                best, best_cost = u, cost
        return best
