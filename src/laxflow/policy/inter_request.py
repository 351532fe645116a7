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
    """Run Algorithm 1 on ``problem`` (already validated)."""
    port_ids = sorted(problem.ports)
    port_index = {p: i for i, p in enumerate(port_ids)}
    num_ports = len(port_ids)
    bw = np.array([problem.ports[p] for p in port_ids], dtype=float)
    reds = {b.id: robust_effective_deadline(r.deadline for r in b.requests) for b in problem.batches}
    order = sorted(problem.batches, key=lambda b: (reds[b.id].red, b.id))

    # Requests are numbered in id order, so "smallest index" is "smallest id".
    req_ids = sorted(r.id for b in problem.batches for r in b.requests)
    req_index = {r: i for i, r in enumerate(req_ids)}
    req_batch = np.empty(len(req_ids), dtype=np.int64)
    # Flat sparse loads, one entry per (request, port) with a positive load.
    f_req: list[int] = []
    f_port: list[int] = []
    f_load: list[float] = []
    for pos, b in enumerate(order):
        for r in b.requests:
            ri = req_index[r.id]
            req_batch[ri] = pos
            for p, v in r.load.items():
                if v > 0:
                    f_req.append(ri)
                    f_port.append(port_index[p])
                    f_load.append(float(v))
    e_req = np.array(f_req, dtype=np.int64)
    e_port = np.array(f_port, dtype=np.int64)
    e_load = np.array(f_load, dtype=float)
    # Every batch's L_i at once: unique (batch position, port) keys, summed;
    # keys sort batch-major, so batch k owns one contiguous slice.
    key = req_batch[e_req] * num_ports + e_port
    ukey, inv = np.unique(key, return_inverse=True)
    usum = np.bincount(inv, weights=e_load, minlength=ukey.size)
    bounds = np.searchsorted(ukey // num_ports, np.arange(len(order) + 1))

    in_pool = np.zeros(len(req_ids), dtype=bool)
    S = np.zeros(num_ports)
    smax, smax_idx = 0.0, 0  # max_u S(u)/bw(u) and its smallest port index
    pruned: list[str] = []
    finish: dict[str, float] = {}

    for pos, batch in enumerate(order):
        lo, hi = bounds[pos], bounds[pos + 1]
        supp = ukey[lo:hi] % num_ports
        L = usum[lo:hi].copy()
        in_pool[[req_index[r.id] for r in batch.requests]] = True

        def bottleneck() -> tuple[float, int]:
            val, idx = smax, smax_idx
            if supp.size:
                ratio = (S[supp] + L) / bw[supp]
                k = int(np.argmax(ratio))
                if ratio[k] > val or (ratio[k] == val and supp[k] < idx):
                    val, idx = float(ratio[k]), int(supp[k])
            return val, idx

        deadline = reds[batch.id].loose_min
        comm, u_star = bottleneck()
        est = problem.now + batch.compute + comm
        while est > deadline and len(pruned) < problem.drop_budget and in_pool.any():
            r_star = _heaviest(u_star, in_pool, e_req, e_port, e_load)
            if r_star < 0:
                break
            pruned.append(req_ids[r_star])
            in_pool[r_star] = False
            mine = e_req == r_star
            rp, rl = e_port[mine], e_load[mine]
            if req_batch[r_star] == pos:
                L[np.searchsorted(supp, rp)] -= rl
                np.maximum(L, 0.0, out=L)  # float dust from subtracting
            else:
                np.subtract.at(S, rp, rl)
                np.maximum(S, 0.0, out=S)
                ratio_all = S / bw
                smax_idx = int(np.argmax(ratio_all))
                smax = float(ratio_all[smax_idx])
            comm, u_star = bottleneck()
            est = problem.now + batch.compute + comm
        finish[batch.id] = est
        if supp.size:
            S[supp] += L
            ratio = S[supp] / bw[supp]
            k = int(np.argmax(ratio))
            if ratio[k] > smax or (ratio[k] == smax and supp[k] < smax_idx):
                smax, smax_idx = float(ratio[k]), int(supp[k])

    return InterResult(
        order=[b.id for b in order],
        red={b.id: reds[b.id].red for b in problem.batches},
        finish=finish,
        pruned=pruned,
    )


def _heaviest(port: int, in_pool: np.ndarray, e_req: np.ndarray, e_port: np.ndarray, e_load: np.ndarray) -> int:
    """Index of the pooled request with the largest load on ``port`` (ties:
    smallest index, i.e. smallest id), or -1 when none loads it."""
    mask = (e_port == port) & in_pool[e_req]
    if not mask.any():
        return -1
    loads, reqs = e_load[mask], e_req[mask]
    top = loads.max()
    return int(reqs[loads == top].min())


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
