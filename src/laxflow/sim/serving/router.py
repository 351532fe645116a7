"""The KV-cache-aware global router and the prefix caches it reads.

Called by the simulator once per request, at its arrival. In the spirit of
Dynamo's KV router: every prefill unit is scored by the prefix blocks it would
still have to obtain (not cached on it) plus the blocks already queued on it,
and the cheapest wins (ties: lowest unit index, so runs are deterministic).
A prefix cached on *another* unit is not recomputed: the chosen unit fetches
those blocks from the unit that holds the longest cached prefix (stage 1).
The decode unit is the one with the fewest KV tokens in residence.

Caches hold block hashes (a block's hash chains its whole prefix, so a match
of block i implies blocks 0..i-1). A unit caches a request's blocks when the
request's prefill compute ends; capacity is LRU, counted in tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence


class PrefixCaches:
    """The prefix caches of all prefill units, with a global hash -> holders index."""

    def __init__(self, num_units: int, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_units)]
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

    def insert(self, unit: int, hashes: Sequence[int], block_size: int) -> None:
        """Cache ``hashes`` on ``unit`` (most recently used), evicting LRU blocks past capacity."""
        lru = self._lru[unit]
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
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


@dataclass(frozen=True)
class Route:
    """Where one request runs and what it reuses (in tokens)."""

    prefill: int  # prefill unit index
    decode: int  # decode unit index
    local_tokens: int  # prefix tokens cached on the prefill unit itself
    remote_tokens: int  # further prefix tokens fetched from ``holder`` (stage 1)
    holder: int | None  # unit holding the longest cached prefix, when remote_tokens > 0

    @property
    def reused_tokens(self) -> int:
        return self.local_tokens + self.remote_tokens


class GlobalRouter:
    """Picks the prefill unit (prefix overlap + queue load) and the decode unit (load)."""

    def __init__(self, num_prefill: int, num_decode: int, caches: PrefixCaches, overlap_weight: float) -> None:
        self.num_prefill = num_prefill
        self.num_decode = num_decode
        self.caches = caches
        self.overlap_weight = overlap_weight

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
        lengths = self.caches.prefix_lengths(hashes)
        blocks = len(hashes)
        best, best_cost = 0, float("inf")
        for u in range(self.num_prefill):
            cost = self.overlap_weight * (blocks - lengths.get(u, 0)) + queued_tokens[u] / block_size
            if cost < best_cost:
                best, best_cost = u, cost
        max_reuse = max(0, input_tokens - 1)
        local = min(lengths.get(best, 0) * block_size, max_reuse)
        holder, global_blocks = None, 0
        for u, n in sorted(lengths.items()):
            if n > global_blocks:
                holder, global_blocks = u, n
        remote = max(0, min(global_blocks * block_size, max_reuse) - local)
        decode = min(range(self.num_decode), key=lambda d: (decode_tokens[d], d))
        return Route(best, decode, local, remote, holder if remote > 0 else None)
