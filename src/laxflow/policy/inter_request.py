"""Inter-request scheduling: RED order, worst-case feasibility, selective pruning.

MFS Appendix B, Algorithm 1. Called by the coordinator on batch arrival and
departure (never per layer), by ``laxflow policy inter`` on a file, and by the
``mfs`` policy when it runs without a coordinator. Deterministic:

1. Batches are sorted by ascending RED (ties by batch id).
2. ``S(u)`` is the load (bytes) that batches already admitted put on port
   ``u``. For batch ``i`` with load ``L_i`` and compute time ``C_i``::

       est_finish = now + C_i + max_u (S(u) + L_i(u)) / bw(u)

   the worst case in which nothing overlaps: every earlier batch's bytes go
   through the bottleneck port before this batch's.
3. While ``est_finish > D_i^Lo`` (the loose set's minimum deadline, see
   :mod:`laxflow.policy.red`), fewer than ``drop_budget`` requests are pruned
   and the candidate pool is not empty: ``u*`` is the port with the largest
   ``(S(u) + L_i(u)) / bw(u)`` (ties: smallest port id); ``r*`` is the
   un-pruned request, among all batches admitted so far and batch ``i``, with
   the largest load on ``u*`` (ties: smallest request id). ``r*`` is pruned
   and its load leaves ``L_i`` or ``S``. One refinement of the paper's loop:
   when no candidate has any load on ``u*`` (the batch is late on compute
   alone), pruning cannot help and the loop stops rather than drop a request
   for nothing.
4. ``S += L_i``.

Pruned requests are not dropped: the caller serves them in the scavenger
class (soft enforcement). Ports are compared by id as strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from laxflow.errors import UserError
from laxflow.policy.red import robust_effective_deadline


@dataclass(frozen=True)
class InterRequest:
    id: str
    deadline: float  # absolute TTFT deadline, s
    load: Mapping[str, float]  # port id -> bytes this request puts on it


@dataclass(frozen=True)
class InterBatch:
    id: str
    compute: float  # s of compute the batch still needs (deterministic, profiled)
    requests: tuple[InterRequest, ...]


@dataclass(frozen=True)
class InterProblem:
    ports: Mapping[str, float]  # port id -> bandwidth, bytes/s
    batches: tuple[InterBatch, ...]
    now: float = 0.0
    drop_budget: int = 0


@dataclass
class InterResult:
    """Algorithm 1's output: the order sigma and the pruned set H."""

    order: list[str]
    red: dict[str, float]
    finish: dict[str, float]  # each batch's estimated finish after pruning
    pruned: list[str] = field(default_factory=list)  # in the order they were pruned

    def as_json(self) -> dict[str, Any]:
        return {"order": self.order, "red": self.red, "finish": self.finish, "pruned": self.pruned}


def schedule(problem: InterProblem) -> InterResult:
    """Run Algorithm 1 on ``problem`` (already validated).

    Each batch touches a handful of ports, so the loop runs on Python floats
    and dicts (cheaper than NumPy calls on tiny arrays); the candidate scan of
    pruning, at most ``drop_budget`` times, is vectorized over all loads.
    """
    port_ids = sorted(problem.ports)
    port_index = {p: i for i, p in enumerate(port_ids)}
    bw = [float(problem.ports[p]) for p in port_ids]
    reds = {b.id: robust_effective_deadline(r.deadline for r in b.requests) for b in problem.batches}
    order = sorted(problem.batches, key=lambda b: (reds[b.id].red, b.id))

    S = [0.0] * len(port_ids)  # load of admitted batches per port
    smax, smax_idx = 0.0, 0  # max_u S(u)/bw(u) and its smallest port index
    pool = _Pool(order, port_index)
    pruned: list[str] = []
    finish: dict[str, float] = {}

    def bottleneck(L: dict[int, float]) -> tuple[float, int]:
        val, idx = smax, smax_idx
        for u, load in L.items():
            ratio = (S[u] + load) / bw[u]
            if ratio > val or (ratio == val and u < idx):
                val, idx = ratio, u
        return val, idx

    for pos, batch in enumerate(order):
        L: dict[int, float] = {}  # L_i, summed in request order
        for r in batch.requests:
            for p, v in r.load.items():
                if v > 0:
                    u = port_index[p]
                    L[u] = L.get(u, 0.0) + v
        pool.admit(len(batch.requests))
        deadline = reds[batch.id].loose_min
        comm, u_star = bottleneck(L)
        est = problem.now + batch.compute + comm
        while est > deadline and len(pruned) < problem.drop_budget and pool.size:
            r_star = pool.heaviest(u_star, pos)
            if r_star is None:
                break
            pruned.append(r_star.id)
            target = L if pool.batch_of(r_star) == pos else S
            for p, v in r_star.load.items():
                if v > 0:
                    u = port_index[p]
                    target[u] = max(target[u] - v, 0.0)  # max: float dust
            if target is S:
                ratios = [x / b for x, b in zip(S, bw)]
                smax = max(ratios)
                smax_idx = ratios.index(smax)
            comm, u_star = bottleneck(L)
            est = problem.now + batch.compute + comm
        finish[batch.id] = est
        for u, load in L.items():
            S[u] += load
            ratio = S[u] / bw[u]
            if ratio > smax or (ratio == smax and u < smax_idx):
                smax, smax_idx = ratio, u

    return InterResult(
        order=[b.id for b in order],
        red={b.id: reds[b.id].red for b in problem.batches},
        finish=finish,
        pruned=pruned,
    )


class _Pool:
    """Algorithm 1's candidate pool P: requests of admitted batches, not pruned.

    The flat (request, port, load) arrays behind :meth:`heaviest` are built on
    the first prune only; most runs never need them.
    """

    def __init__(self, order: list[InterBatch], port_index: dict[str, int]) -> None:
        self._order = order
        self._port_index = port_index
        self._admitted = 0
        self._pruned = 0
        self._flat: tuple[np.ndarray, ...] | None = None

    @property
    def size(self) -> int:
        return self._admitted - self._pruned

    def admit(self, count: int) -> None:
        self._admitted += count

    def batch_of(self, request: InterRequest) -> int:
        assert self._flat is not None
        return int(self._batch_pos[self._index[request.id]])

    def heaviest(self, port: int, pos: int) -> InterRequest | None:
        """The pooled request (batches at positions <= ``pos``) with the
        largest load on ``port``, ties to the smallest id; None if none loads it."""
        if self._flat is None:
            self._build()
        e_req, e_port, e_load = self._flat  # type: ignore[misc]
        mask = (e_port == port) & (self._batch_pos[e_req] <= pos) & ~self._gone[e_req]
        if not mask.any():
            return None
        loads, reqs = e_load[mask], e_req[mask]
        best = int(reqs[loads == loads.max()].min())  # requests are numbered in id order
        self._gone[best] = True
        self._pruned += 1
        return self._requests[best]

    def _build(self) -> None:
        reqs = sorted((r for b in self._order for r in b.requests), key=lambda r: r.id)
        self._requests = reqs
        self._index = {r.id: i for i, r in enumerate(reqs)}
        where = {r.id: pos for pos, b in enumerate(self._order) for r in b.requests}
        self._batch_pos = np.array([where[r.id] for r in reqs], dtype=np.int64)
        self._gone = np.zeros(len(reqs), dtype=bool)
        rows = [(i, self._port_index[p], v) for i, r in enumerate(reqs) for p, v in r.load.items() if v > 0]
        e_req = np.array([x[0] for x in rows], dtype=np.int64)
        e_port = np.array([x[1] for x in rows], dtype=np.int64)
        e_load = np.array([x[2] for x in rows], dtype=float)
        self._flat = (e_req, e_port, e_load)


# ---------------------------------------------------------------- input file


def parse_problem(data: Any) -> InterProblem:
    """Validate a decoded ``laxflow policy inter`` file; UserError on the first problem."""
    if not isinstance(data, dict):
        raise UserError("inter input: expected a JSON object with 'ports' and 'batches'")
    unknown = set(data) - {"description", "now", "drop_budget", "ports", "batches"}
    if unknown:
        raise UserError(
            f"inter input: unknown key {sorted(unknown)[0]!r} (expected description, now, drop_budget, ports, batches)"
        )
    now = _number(data.get("now", 0.0), "'now'")
    budget = data.get("drop_budget", 0)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise UserError(f"inter input: 'drop_budget' must be a non-negative integer, got {budget!r}")
    ports = data.get("ports")
    if not isinstance(ports, dict) or not ports:
        raise UserError("inter input: 'ports' must be a non-empty object of port id -> bandwidth (bytes/s)")
    bw: dict[str, float] = {}
    for p, v in ports.items():
        value = _number(v, f"port {p!r} bandwidth")
        if value <= 0:
            raise UserError(f"inter input: port {p!r} bandwidth must be > 0, got {v!r}")
        bw[str(p)] = value
    raw_batches = data.get("batches")
    if not isinstance(raw_batches, list):
        raise UserError("inter input: 'batches' must be a list")
    batch_ids: set[str] = set()
    request_ids: set[str] = set()
    batches = []
    for k, raw in enumerate(raw_batches):
        if not isinstance(raw, dict):
            raise UserError(f"inter input: batch #{k} must be an object")
        bid = _ident(raw.get("id"), f"batch #{k}")
        if bid in batch_ids:
            raise UserError(f"inter input: duplicate batch id {bid!r}")
        batch_ids.add(bid)
        compute = _number(raw.get("compute", 0.0), f"batch {bid!r} compute")
        if compute < 0:
            raise UserError(f"inter input: batch {bid!r} compute must be >= 0, got {compute!r}")
        raw_reqs = raw.get("requests")
        if not isinstance(raw_reqs, list) or not raw_reqs:
            raise UserError(f"inter input: batch {bid!r} is empty (expected a non-empty 'requests' list)")
        reqs = []
        for j, rr in enumerate(raw_reqs):
            if not isinstance(rr, dict):
                raise UserError(f"inter input: batch {bid!r} request #{j} must be an object")
            rid = _ident(rr.get("id"), f"batch {bid!r} request #{j}")
            if rid in request_ids:
                raise UserError(f"inter input: duplicate request id {rid!r}")
            request_ids.add(rid)
            deadline = _number(rr.get("deadline"), f"request {rid!r} deadline")
            raw_load = rr.get("load", {})
            if not isinstance(raw_load, dict):
                raise UserError(f"inter input: request {rid!r} load must be an object of port id -> bytes")
            load: dict[str, float] = {}
            for p, v in raw_load.items():
                if p not in bw:
                    raise UserError(f"inter input: request {rid!r} names unknown port {p!r} (ports: {', '.join(sorted(bw))})")
                value = _number(v, f"request {rid!r} load on {p!r}")
                if value < 0:
                    raise UserError(f"inter input: request {rid!r} load on {p!r} must be >= 0, got {v!r}")
                load[p] = value
            reqs.append(InterRequest(rid, deadline, load))
        batches.append(InterBatch(bid, compute, tuple(reqs)))
    return InterProblem(ports=bw, batches=tuple(batches), now=now, drop_budget=budget)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"inter input: {what} must be a finite number, got {value!r}")
    return float(value)


def _ident(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"inter input: {what} needs a non-empty string 'id', got {value!r}")
    return value
