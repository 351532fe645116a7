"""The few-flow path of :func:`~laxflow.sim.network.allocator.allocate`.

With a handful of live flows (the common case of a serving simulation) the
NumPy calls of the vectorized allocator cost far more than its arithmetic.
:func:`allocate_few` runs the same algorithm (strict priority across levels,
the same rounds of progressive filling inside one, the same saturation
snapping) on Python floats over the links the flows use, doing every float
operation the vectorized code does in the same order, so the rates are
bit-identical (a test compares the two on random cases). ``allocate`` calls
it when ``usage`` has at most :data:`FEW_ENTRIES` entries per level
(measured break-even with bench-like inputs: one level of 4-link paths, or
strict-priority levels of a few flows each, as MFS makes).
"""

from __future__ import annotations

import math

import numpy as np

from laxflow.sim.network import allocator

# Up to this many usage entries (flow x link) per level the scalar path is faster.
FEW_ENTRIES = 16


def allocate_few(
    capacity: np.ndarray,
    usage: allocator.Usage,
    level: np.ndarray,
    cap: np.ndarray,
    from_level: int | None,
    prev_rate: np.ndarray | None,
) -> np.ndarray:
    """Rates of all flows (see ``allocate``; same arguments)."""
    n = usage.num_flows
    ptr = usage.ptr.tolist()
    links = usage.link.tolist()
    weights = usage.weight.tolist()
    entries = [list(zip(links[ptr[i] : ptr[i + 1]], weights[ptr[i] : ptr[i + 1]])) for i in range(n)]
    levels = level.tolist()
    caps = cap.tolist()
    rates = [0.0] * n
    link_cap = capacity[usage.link].tolist()
    residual = dict(zip(links, link_cap))
    eps = allocator.SATURATED_REL_EPS
    limit = {link: c * eps for link, c in zip(links, link_cap)}
    lowest = min(levels)
    if from_level is not None and from_level <= lowest:
        from_level = None
    order = sorted(range(n), key=levels.__getitem__)  # stable, as np.argsort(kind="stable")
    if from_level is not None and prev_rate is not None:
        prev = prev_rate.tolist()
        used: dict[int, float] = {}
        for i in range(n):
            if levels[i] < from_level:
                rates[i] = r = prev[i]
                for link, w in entries[i]:
                    used[link] = used.get(link, 0.0) + w * r
        for link, load in used.items():
            residual[link] -= load
        _snap(residual, limit, list(residual))
        order = [i for i in order if levels[i] >= from_level]
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and levels[order[end]] == levels[order[start]]:
            end += 1
        group = order[start:end]
        _fill(residual, group, entries, caps, rates)
        _snap(residual, limit, [link for i in group for link, _ in entries[i]])
        start = end
    return np.array(rates)


def _snap(residual: dict[int, float], limit: dict[int, float], links: list[int]) -> None:
    for link in links:
        if residual[link] <= limit[link]:
            residual[link] = 0.0


def _fill(
    residual: dict[int, float], flows: list[int], entries: list[list[tuple[int, float]]], cap: list[float], rates: list[float]
) -> None:
    """``water_fill`` for the given flows (global indices) on ``residual``; writes ``rates``."""
    if len(flows) == 1:
        i = flows[0]
        share = min([residual[link] / w for link, w in entries[i]])
        rates[i] = rate = max(0.0, min(share, cap[i]))
        for link, w in entries[i]:
            residual[link] = max(residual[link] - w * rate, 0.0)
        return
    for i in flows:
        for link, _ in entries[i]:
            residual[link] = max(residual[link], 0.0)
    capped = min([cap[i] for i in flows]) < math.inf  # a finite cap (caps are >= 0, never NaN)
    below, above = 1.0 - allocator.REL_EPS, 1.0 + allocator.REL_EPS  # read here: one definition
    alive = flows
    while True:
        load: dict[int, float] = {}
        for i in alive:
            for link, w in entries[i]:
                load[link] = load.get(link, 0.0) + w
        share = {link: residual[link] / w for link, w in load.items()}
        best = [min([share[link] for link, _ in entries[i]]) for i in alive]
        if capped:
            best = [min(b, cap[i]) for b, i in zip(best, alive)]
        blocked = set()
        for i, b in zip(alive, best):
            for link, _ in entries[i]:
                if b < share[link] * below:
                    blocked.add(link)
        used: dict[int, float] = {}
        thaw = []
        for i, b in zip(alive, best):
            # Frozen: one of its links is a local minimum (not blocked), or its cap binds.
            if not blocked.issuperset([link for link, _ in entries[i]]) or (capped and cap[i] <= b * above):
                rates[i] = b
                for link, w in entries[i]:
                    used[link] = used.get(link, 0.0) + w * b
            else:
                thaw.append(i)
        for link, amount in used.items():
            residual[link] = max(residual[link] - amount, 0.0)
        if not thaw:
            return
        alive = thaw
