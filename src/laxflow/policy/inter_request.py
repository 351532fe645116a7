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

Two entry points: :func:`schedule` takes the objects a file parses into
(``laxflow.policy_cli.parse_problem``: file parsing lives outside this pure
package); :func:`schedule_table` takes the arrays a coordinator keeps
(:class:`LoadTable`), which is what runs in both cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from laxflow.policy.red import red_many


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


@dataclass(frozen=True)
class LoadTable:
    """Algorithm 1's input as arrays: what the coordinator keeps per cluster.

    Ports are numbered in id order, requests are listed batch by batch in
    input order (their loads are summed in that order), and each entry is one
    positive load of one request on one port.
    """

    now: float
    drop_budget: int
    bandwidth: np.ndarray  # bytes/s per port
    batch_ids: list[str]
    compute: np.ndarray  # s per batch
    request_ids: list[str]
    request_batch: np.ndarray  # batch index per request
    deadline: np.ndarray  # per request
    entry_request: np.ndarray
    entry_port: np.ndarray
    entry_load: np.ndarray  # bytes, > 0

    @classmethod
    def from_problem(cls, problem: InterProblem) -> "LoadTable":
        port_ids = sorted(problem.ports)
        port_index = {p: i for i, p in enumerate(port_ids)}
        builder = LoadTableBuilder()
        for batch in problem.batches:
            requests = ((r.id, r.deadline, {port_index[p]: v for p, v in r.load.items()}) for r in batch.requests)
            builder.add_batch(batch.id, batch.compute, requests)
        bandwidth = np.array([problem.ports[p] for p in port_ids], dtype=float)
        return builder.build(problem.now, problem.drop_budget, bandwidth)


class LoadTableBuilder:
    """Collects Algorithm 1's input batch by batch into a :class:`LoadTable`.

    The one builder of the table: used for a parsed file
    (:meth:`LoadTable.from_problem`), by the ``mfs`` policy's standalone
    pruning from its live flows, and by the coordinator from daemon reports.
    Entries with no load are left out at :meth:`build`.
    """

    def __init__(self) -> None:
        self.batch_ids: list[str] = []
        self.compute: list[float] = []
        self.request_ids: list[str] = []
        self.request_batch: list[int] = []
        self.deadline: list[float] = []
        self._request: list[int] = []
        self._port: list[int] = []
        self._load: list[float] = []

    def add_batch(self, batch_id: str, compute: float, requests: Iterable[tuple[str, float, Mapping[int, float]]]) -> None:
        """A batch (``compute`` s still to run) and its requests: (id, deadline, port index -> bytes)."""
        b = len(self.batch_ids)
        for request_id, deadline, load in requests:
            self._request.extend([len(self.request_ids)] * len(load))
            self._port.extend(load)
            self._load.extend(load.values())
            self.request_ids.append(request_id)
            self.request_batch.append(b)
            self.deadline.append(deadline)
        self.batch_ids.append(batch_id)
        self.compute.append(compute)

    def build(self, now: float, drop_budget: int, bandwidth: np.ndarray) -> LoadTable:
        load = np.array(self._load, dtype=float)
        keep = load > 0
        return LoadTable(
            now=now,
            drop_budget=drop_budget,
            bandwidth=np.asarray(bandwidth, dtype=float),
            batch_ids=list(self.batch_ids),
            compute=np.array(self.compute, dtype=float),
            request_ids=list(self.request_ids),
            request_batch=np.array(self.request_batch, dtype=np.int64),
            deadline=np.array(self.deadline, dtype=float),
            entry_request=np.array(self._request, dtype=np.int64)[keep],
            entry_port=np.array(self._port, dtype=np.int64)[keep],
            entry_load=load[keep],
        )


def schedule(problem: InterProblem) -> InterResult:
    """Run Algorithm 1 on a validated ``problem``."""
    return schedule_table(LoadTable.from_problem(problem))


def schedule_table(t: LoadTable) -> InterResult:
    """Run Algorithm 1 on arrays.

    Batches that pass the feasibility check need no pruning, and for a run of
    them the estimates are prefix sums: :func:`_sweep` computes them for all
    remaining batches at once and the first that fails is found. Only that
    batch goes through the literal pruning loop (:func:`_prune_batch`); then
    the sweep resumes. Once the budget is spent, one sweep ends the run.
    """
    nb = len(t.batch_ids)
    red, loose = red_many(t.request_batch, t.deadline, nb)
    batch_rank = _string_rank(t.batch_ids)
    order = np.lexsort((batch_rank, red))  # ascending RED, ties by batch id
    pos_of = np.empty(nb, dtype=np.int64)
    pos_of[order] = np.arange(nb)
    loads = _BatchLoads(t, pos_of)
    compute, deadline = t.compute[order], loose[order]
    requests_at = np.bincount(pos_of[t.request_batch], minlength=nb)

    S = np.zeros(t.bandwidth.size)  # load of admitted batches per port
    pool = _Pool(t, pos_of)
    finish = np.zeros(nb)
    pos = 0
    while pos < nb:
        est = t.now + compute[pos:] + _sweep(loads, pos, S, t.bandwidth)
        can_prune = len(pool.pruned) < t.drop_budget
        late = np.flatnonzero(est > deadline[pos:]) if can_prune else np.zeros(0, np.int64)
        stop = pos + int(late[0]) if late.size else nb
        finish[pos:stop] = est[: stop - pos]
        pool.admit(int(requests_at[pos:stop].sum()))
        S += loads.port_totals(pos, stop, S.size)
        if stop == nb:
            break
        pool.admit(int(requests_at[stop]))
        finish[stop] = _prune_batch(t, stop, float(compute[stop]), float(deadline[stop]), loads, S, pool)
        pos = stop + 1

    return InterResult(
        order=[t.batch_ids[b] for b in order],
        red={b: float(red[k]) for k, b in enumerate(t.batch_ids)},
        finish={t.batch_ids[b]: float(finish[k]) for k, b in enumerate(order)},
        pruned=[t.request_ids[r] for r in pool.pruned],
    )


def _string_rank(ids: list[str]) -> np.ndarray:
    rank = np.empty(len(ids), dtype=np.int64)
    rank[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
    return rank


class _BatchLoads:
    """Every batch's L_i as sparse (port, load) entries, in RED order
    (batch-major), and the same entries in (port, batch) order."""

    def __init__(self, t: LoadTable, pos_of: np.ndarray) -> None:
        num_ports = max(t.bandwidth.size, 1)
        bpos = pos_of[t.request_batch[t.entry_request]]
        key = bpos * num_ports + t.entry_port
        srt = np.argsort(key, kind="stable")  # stable: request order inside a (batch, port) sum
        key = key[srt]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, np.int64)
        first = srt[starts]
        self.load = np.add.reduceat(t.entry_load[srt], starts) if key.size else np.zeros(0)
        self.batch = bpos[first]
        self.port = t.entry_port[first]
        self.bounds = np.searchsorted(self.batch, np.arange(len(pos_of) + 1))
        # Batch-major already: a stable sort by port gives (port, batch) order.
        self.by_port = np.argsort(self.port, kind="stable")

    def of(self, pos: int) -> dict[int, float]:
        lo, hi = self.bounds[pos], self.bounds[pos + 1]
        return dict(zip(self.port[lo:hi].tolist(), self.load[lo:hi].tolist()))

    def port_totals(self, lo: int, hi: int, num_ports: int) -> np.ndarray:
        a, b = self.bounds[lo], self.bounds[hi]
        return np.bincount(self.port[a:b], weights=self.load[a:b], minlength=num_ports)


def _sweep(loads: _BatchLoads, start: int, S: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """max_u (S(u) + L_i(u)) / bw(u) for every batch i >= start, assuming no
    pruning from ``start`` on: S grows by each batch's L in turn.

    Per entry, its port's load just after its batch is S plus the port's
    running sum; the max over all ports before batch i is the running max of
    those ratios (a port's ratio only grows), seeded with max(S / bw).
    """
    n = len(loads.bounds) - 1
    sel = loads.by_port if start == 0 else loads.by_port[loads.batch[loads.by_port] >= start]
    port, load = loads.port[sel], loads.load[sel]
    ratio = np.empty(loads.load.size)
    if port.size:
        csum = np.cumsum(load)
        first = np.r_[True, port[1:] != port[:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(port.size), 0))
        ratio[sel] = (S[port] + (csum - csum[group_start] + load[group_start])) / bw[port]
    out = np.full(n - start, -np.inf)
    counts = np.diff(loads.bounds[start:])
    nonempty = counts > 0
    if nonempty.any():
        lo = loads.bounds[start]
        out[nonempty] = np.maximum.reduceat(ratio[lo:], loads.bounds[start:-1][nonempty] - lo)
    seed = float(np.max(S / bw)) if S.size else 0.0
    prior = np.maximum.accumulate(np.r_[seed, out[:-1]])
    return np.maximum(prior, out)


def _prune_batch(
    t: LoadTable, pos: int, compute: float, deadline: float, loads: _BatchLoads, S: np.ndarray, pool: "_Pool"
) -> float:
    """The literal loop of Algorithm 1 for the batch at ``pos``, which failed
    the check: prune, re-estimate, repeat. Updates ``S`` (+= what is left of
    the batch's L, -= the loads of pruned earlier requests) and the pool;
    returns the batch's final estimate. Python floats: it touches a handful
    of ports, and runs at most ``drop_budget`` times per run of the sweep."""
    bw = t.bandwidth
    L = loads.of(pos)

    def bottleneck() -> tuple[float, int]:
        ratios = S / bw
        idx = int(np.argmax(ratios))  # first maximum: smallest port id
        val = float(ratios[idx])
        for u, load in L.items():
            ratio = (S[u] + load) / bw[u]
            if ratio > val or (ratio == val and u < idx):
                val, idx = ratio, u
        return val, idx

    comm, u_star = bottleneck()
    est = t.now + compute + comm
    while est > deadline and len(pool.pruned) < t.drop_budget and pool.size:
        r_star = pool.prune_heaviest(u_star, pos)
        if r_star < 0:
            break
        mine = pool.pos_of_request(r_star) == pos
        entries = t.entry_request == r_star
        for u, v in zip(t.entry_port[entries].tolist(), t.entry_load[entries].tolist()):
            if mine:
                L[u] = max(L[u] - v, 0.0)  # max: float dust
            else:
                S[u] = max(S[u] - v, 0.0)
        comm, u_star = bottleneck()
        est = t.now + compute + comm
    for u, load in L.items():
        S[u] += load
    return est


class _Pool:
    """Algorithm 1's candidate pool P: requests of admitted batches, not pruned."""

    def __init__(self, t: LoadTable, pos_of: np.ndarray) -> None:
        self._t = t
        self._req_pos = pos_of[t.request_batch]  # RED position of each request's batch
        self._id_rank: np.ndarray | None = None  # built on the first prune
        self._gone = np.zeros(len(t.request_ids), dtype=bool)
        self._admitted = 0
        self.pruned: list[int] = []

    @property
    def size(self) -> int:
        return self._admitted - len(self.pruned)

    def admit(self, count: int) -> None:
        self._admitted += count

    def pos_of_request(self, r: int) -> int:
        return int(self._req_pos[r])

    def prune_heaviest(self, port: int, pos: int) -> int:
        """Prune and return the pooled request (batches at positions <= ``pos``)
        with the largest load on ``port``, ties to the smallest id; -1 if no
        pooled request loads ``port``."""
        t = self._t
        if self._id_rank is None:
            self._id_rank = _string_rank(t.request_ids)
        r = t.entry_request
        mask = (t.entry_port == port) & (self._req_pos[r] <= pos) & ~self._gone[r]
        if not mask.any():
            return -1
        load, cand = t.entry_load[mask], r[mask]
        top = cand[load == load.max()]
        best = int(top[np.argmin(self._id_rank[top])])
        self._gone[best] = True
        self.pruned.append(best)
        return best
