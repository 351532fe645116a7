"""The few-flow path of :func:`~laxflow.sim.network.allocator.allocate`.

With a handful of live flows (the common case of a serving simulation) the
NumPy calls of the vectorized allocator cost far more than its arithmetic.
:func:`allocate_few` runs the same algorithm (strict priority across levels,
the same rounds of progressive filling inside one, the same saturation
snapping) on Python floats over the links the flows use, doing every float
operation the vectorized code does in the same order, so the rates are
bit-identical (a test compares the two on random cases). ``allocate`` calls
it when ``usage`` has at most :data:`FEW_ENTRIES` entries.
"""

from __future__ import annotations

import numpy as np

from laxflow.sim.network import allocator

# Up to this many usage entries (flow x link) the scalar path is faster.
FEW_ENTRIES = 64


def allocate_few(
    capacity: np.ndarray,
    ptr: list[int],
    links: list[int],
    weights: list[float],
    level: list[int],
    cap: list[float],
    from_level: int | None,
    prev_rate: list[float] | None,
) -> list[float]:
    """Rates of all flows (see ``allocate``), from its inputs as Python lists."""
    n = len(level)
    rates = [0.0] * n
    residual = {link: float(capacity[link]) for link in links}
    limit = {link: float(capacity[link]) * allocator.SATURATED_REL_EPS for link in residual}
    lowest = min(level)
    if from_level is not None and from_level <= lowest:
        from_level = None
    order = sorted(range(n), key=level.__getitem__)  # stable, as np.argsort(kind="stable")
    if from_level is not None and prev_rate is not None:
        used: dict[int, float] = {}
        for i in range(n):
            if level[i] < from_level:
                rates[i] = prev_rate[i]
                for e in range(ptr[i], ptr[i + 1]):
                    used[links[e]] = used.get(links[e], 0.0) + weights[e] * prev_rate[i]
        for link, load in used.items():
            residual[link] -= load
        _snap(residual, limit, residual)
        order = [i for i in order if level[i] >= from_level]
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and level[order[end]] == level[order[start]]:
            end += 1
        group = order[start:end]
        _fill(residual, group, ptr, links, weights, cap, rates)
        _snap(residual, limit, [links[e] for i in group for e in range(ptr[i], ptr[i + 1])])
        start = end
    return rates


def _snap(residual: dict[int, float], limit: dict[int, float], links) -> None:  # type: ignore[no-untyped-def]
    for link in links:
        if residual[link] <= limit[link]:
            residual[link] = 0.0


def _fill(
    residual: dict[int, float],
    flows: list[int],
    ptr: list[int],
    links: list[int],
    weights: list[float],
    cap: list[float],
    rates: list[float],
) -> None:
    """``water_fill`` for the given flows (global indices) on ``residual``; writes ``rates``."""
    if len(flows) == 1:
        i = flows[0]
        es = range(ptr[i], ptr[i + 1])
        share = min([residual[links[e]] / weights[e] for e in es])
        rate = max(0.0, min(share, cap[i]))
        rates[i] = rate
        for e in es:
            residual[links[e]] = max(residual[links[e]] - weights[e] * rate, 0.0)
        return
    for link in {links[e] for i in flows for e in range(ptr[i], ptr[i + 1])}:
        residual[link] = max(residual[link], 0.0)
    capped = any(cap[i] != np.inf and cap[i] == cap[i] for i in flows)
    below, above = 1.0 - allocator.REL_EPS, 1.0 + allocator.REL_EPS  # read here: one definition
    alive = list(flows)
    while True:
        load: dict[int, float] = {}
        for i in alive:
            for e in range(ptr[i], ptr[i + 1]):
                load[links[e]] = load.get(links[e], 0.0) + weights[e]
        share = {link: residual[link] / w for link, w in load.items()}
        best = {}
        for i in alive:
            b = min([share[links[e]] for e in range(ptr[i], ptr[i + 1])])
            best[i] = min(b, cap[i]) if capped else b
        blocked = set()
        for i in alive:
            for e in range(ptr[i], ptr[i + 1]):
                if best[i] < share[links[e]] * below:
                    blocked.add(links[e])
        freeze = []
        thaw = []
        for i in alive:
            frozen = any(links[e] not in blocked for e in range(ptr[i], ptr[i + 1]))
            if capped and cap[i] <= best[i] * above:
                frozen = True
            (freeze if frozen else thaw).append(i)
        used: dict[int, float] = {}
        for i in freeze:
            rates[i] = best[i]
            for e in range(ptr[i], ptr[i + 1]):
                used[links[e]] = used.get(links[e], 0.0) + weights[e] * best[i]
        for link, amount in used.items():
            residual[link] = max(residual[link] - amount, 0.0)
        if not thaw:
            return
        alive = thaw
