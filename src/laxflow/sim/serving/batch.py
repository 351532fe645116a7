"""One prefill batch, run layer by layer on its unit, issuing the three stages of traffic.

Created and started by the simulator when a prefill unit forms a batch; from
then on driven only by events on the shared queue (compute segments ending,
flows completing). It sees the simulator only through a narrow
:class:`BatchContext` (queue, network, model, cluster, two callbacks), and
tells it when its compute ends and when a request's last P2D byte lands.
Every transfer it issues becomes flows through the run's
:class:`~laxflow.sim.serving.instances.fabric.Fabric` (``BatchContext.fabric``:
shapes once per batch, flows per layer, bytes delivered per stage).

A batch is one step of the unit: every attention-DP rank's own batch
together (the MoE all-to-alls synchronize the ranks layer by layer).

Per layer j:

1. Stage 1 (reuse): the KV of layer j for the prefix held by other units is
   fetched by one flow group per holder unit with target layer j, issued at
   batch start (or ``reuse_lookahead`` layers ahead). Layer j does not start
   until every reuse group of layer j has landed: that wait is a stall.
2. Stage 2 (collective): each blocking collective of the layer plan is one
   flow group over the unit's GPUs (inter-node pairs only; intra-node pairs
   take their NVSwitch time in parallel); compute resumes when both are done.
3. Stage 3 (p2d): when layer j's compute ends, each request's layer-j KV (its
   whole context) goes to its decode unit as one flow, without blocking the
   next layer.

At every layer boundary and when compute ends, the request fields of the
batch's live flows (``current_layer``, ``compute_done``) are updated first
and the network is asked to reschedule, naming them.

Flow deadlines: every flow carries its request's absolute TTFT deadline
(batch-wide flows the tightest of the batch, and the id of that request).
``downstream`` is the compute still needed after the flow lands: for a P2D
flow 0 (nothing runs after the KV lands; each layer's KV only has to be there
by the deadline), for a reuse flow of layer j the compute of layers j..L-1,
for a collective the rest of its layer and the layers after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from laxflow.policy.flow import Flow, Stage
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.cluster import Cluster, Unit
from laxflow.sim.serving.instances.fabric import Fabric, Shape
from laxflow.sim.serving.plan import LayerPlan, ModelRunner
from laxflow.sim.serving.request_state import RequestState

__all__ = ["BatchContext", "BatchRun", "Shape"]  # Shape: its home is instances/fabric.py now (re-exported)


@dataclass
class BatchContext:
    """What a batch needs from the simulator, and nothing more (built once per run by the simulator)."""

    queue: EventQueue
    network: FluidNetwork
    runner: ModelRunner
    cluster: Cluster
    reuse_lookahead: int | None
    compute_done: Callable[["BatchRun"], None]  # the batch's last layer computed: free the unit
    request_done: Callable[[RequestState, float], None]  # a request's last P2D byte landed at this time
    # The run's transfers as flows (over cluster and network); None: a Fabric of its own over them.
    fabric: Fabric | None = None

    def __post_init__(self) -> None:
        if self.fabric is None:
            self.fabric = Fabric(self.queue, self.network, self.cluster, self.cluster.config.nvswitch_bytes_per_s)

    @property
    def delivered(self) -> dict[str, float]:
        """Bytes each stage's flows delivered over the network (true bytes, not the engine's per-pair units)."""
        return self.fabric.delivered


class BatchRun:
    """The layer-by-layer execution of one prefill batch."""

    def __init__(self, sim: BatchContext, batch_id: int, unit: Unit, states: Sequence[RequestState], plan: LayerPlan):
        self.sim = sim
        self.id = batch_id
        self.unit = unit
        self.states = list(states)
        self.plan = plan
        self.num_layers = sim.runner.num_layers
        self.layer = 0
        self.tag = f"b{batch_id}"
        urgent = min(self.states, key=lambda s: (s.deadline, s.index))
        self.deadline = urgent.deadline
        self.urgent_request = urgent.id
        self.flows: dict[int, Flow] = {}  # live flows of this batch, by id(flow)
        self.start = sim.queue.now
        self.compute_end: float | None = None
        self.stall = 0.0  # s waiting for reuse (stage 1) before a layer
        self.cct: list[float] = []  # s per layer, stage-2 collectives (dispatch + combine, ...)
        # s per layer, the same collectives alone on an idle fabric (analytic, from bytes and idle
        # bottleneck rates at batch start): CCT / idle_cct is the contention a policy could remove.
        self._fabric = sim.fabric
        # Fabric.issue bound once (called per flow): (fid, shape, layer, deadline, downstream, request, batch,
        # current_layer, compute_done, live flows, then, arg) -> parts that will call then(arg).
        self._issue = sim.fabric.issue
        self.idle_cct = plan.idle_cct(sim.fabric.nvswitch)
        self._pending_reuse = [0] * self.num_layers
        self._reuse_issued = 0  # layers whose reuse groups are issued
        self._reuse_groups: list[tuple[str, Shape]] = []  # per holder (its name): one layer's fetch
        # Per collective segment (by index in plan.segments): its shape, its bytes charged to each request,
        # and the compute left in the layer after it.
        self._collectives = {k: (self._fabric.shape(Stage.COLLECTIVE, seg.per_gpu_bytes, seg.pattern),
                                 seg.network_bytes / len(self.states), plan.compute_after(k))
                             for k, seg in enumerate(plan.segments) if seg.kind != "compute"}
        self._p2d: list[tuple[RequestState, float, Shape]] | None = None  # per request: p2d bytes, shape of a layer
        self._stall_since: float | None = None
        self._coll_pending = 0
        self._coll_start = 0.0
        self._layer_cct = 0.0
        # Preemptible execution (set by a PrefillDriver before begin(); None: a run-to-end batch).
        # ``check(kind, progress)`` is asked at a boundary only while ``preempt_requested``; True = suspend here.
        self.check: Callable[[int, float], bool] | None = None
        self.preempt_requested = False
        self.op_fractions: tuple[float, ...] = ()  # compute segments split at operator boundaries (by FLOPs)
        self.chunk_marks: tuple[float, ...] = ()  # work fractions where a chunk of a chunked prefill ends
        self._work = 0.0  # compute seconds done
        self._last_check = 0.0  # progress at the previous boundary (a chunk mark crossed since -> CHUNK)
        self._resume_at: tuple | None = None

    # -- start --------------------------------------------------------------------

    def begin(self) -> None:
        """Called by the simulator right after creating the batch: issue the fetches, start layer 0."""
        now = self.sim.queue.now
        runner, cluster = self.sim.runner, self.sim.cluster
        kv = runner.kv_transfer_bytes_per_token_per_layer
        by_holder: dict[int, list[tuple[RequestState, int, int]]] = {}
        for s in self.states:
            s.batch, s.batch_start = self.id, now
            for h, rank, tokens in s.route.fetches:
                by_holder.setdefault(h, []).append((s, rank, tokens))
        for h in sorted(by_holder):
            holder = cluster.prefill_units[h]
            traffic: dict[tuple[int, int], float] = {}
            for s, rank, tokens in by_holder[h]:
                part = cluster.transfer_traffic(runner.kv_gpus(holder, rank), runner.kv_gpus(self.unit, s.rank),
                                                tokens * kv)
                for pair, b in part.items():
                    traffic[pair] = traffic.get(pair, 0.0) + b
            pattern = cluster.pattern(traffic)  # payload 1 = one layer's fetch from this holder, in bytes
            payload = sum(tokens for _, _, tokens in by_holder[h])
            for s, _, tokens in by_holder[h]:
                s.add_bytes("reuse", pattern.net_bytes * tokens / payload * self.num_layers)
            self._reuse_groups.append((holder.name, self._fabric.shape(Stage.REUSE, 1.0, pattern)))
        ahead = self.sim.reuse_lookahead
        self._issue_reuse_until(self.num_layers if ahead is None else min(self.num_layers, ahead))
        self._begin_layer(0)

    def _issue_reuse_until(self, layers: int) -> None:
        while self._reuse_issued < layers:
            j = self._reuse_issued
            self._reuse_issued += 1
            downstream = (self.num_layers - j) * self.plan.compute
            for holder, shape in self._reuse_groups:
                done = self._issue(f"{self.tag}.L{j}.reuse.{holder}", shape, j, self.deadline, downstream,
                                   self.urgent_request, self.tag, self.layer, self.compute_end is not None,
                                   self.flows, self._reuse_done, j)
                self._pending_reuse[j] += done

    # -- layers ---------------------------------------------------------------------

    def _begin_layer(self, j: int) -> None:
        self.layer = j
        for f in self.flows.values():
            f.current_layer = j
        ahead = self.sim.reuse_lookahead
        if ahead is not None:
            self._issue_reuse_until(min(self.num_layers, j + ahead))
        self.sim.network.reschedule(self.flows.values())
        self._layer_cct = 0.0
        if self._pending_reuse[j] > 0:
            self._stall_since = self.sim.queue.now
            return
        self._run_segment(0)

    def _reuse_done(self, j: int) -> None:
        self._pending_reuse[j] -= 1
        if self._pending_reuse[j] == 0 and j == self.layer and self._stall_since is not None:
            self.stall += self.sim.queue.now - self._stall_since
            self._stall_since = None
            self._run_segment(0)

    def _run_segment(self, k: int) -> None:
        queue = self.sim.queue
        segments = self.plan.segments
        while k < len(segments):
            seg = segments[k]
            if seg.kind == "compute":
                if self.check is not None and self.op_fractions:
                    self._run_op(k, 0)
                else:
                    queue.push(queue.now + seg.seconds, Priority.COMPUTE, self._run_segment, k + 1)
                return
            shape, per_request, after = self._collectives[k]
            downstream = after + (self.num_layers - 1 - self.layer) * self.plan.compute
            self._coll_start = queue.now
            self._coll_pending = self._issue(
                f"{self.tag}.L{self.layer}.{seg.name}", shape, self.layer, self.deadline, downstream,
                self.urgent_request, self.tag, self.layer, self.compute_end is not None, self.flows,
                self._collective_part_done, k,
            )
            for s in self.states:
                s.add_bytes("collective", per_request)
            if self._coll_pending:
                return
            k += 1
        self._layer_done()

    # -- preemption (driver mode only) ------------------------------------------------

    @property
    def progress(self) -> float:
        """Share of this batch's compute done (0..1)."""
        total = self.plan.compute * self.num_layers
        return min(1.0, self._work / total) if total > 0 else 1.0

    def _run_op(self, k: int, o: int) -> None:
        seconds = self.plan.segments[k].seconds * self.op_fractions[o]
        self.sim.queue.push(self.sim.queue.now + seconds, Priority.COMPUTE, self._op_done, (k, o, seconds))

    def _op_done(self, arg: tuple[int, int, float]) -> None:
        k, o, seconds = arg
        self._work += seconds
        if o + 1 >= len(self.op_fractions):
            self._run_segment(k + 1)  # the layer's (or segment's) end is checked in _layer_done
            return
        if self._boundary(0, ("op", k, o + 1)):
            return
        self._run_op(k, o + 1)

    def _boundary(self, kind: int, resume: tuple) -> bool:
        """At a boundary of ``kind`` (0 operator, 1 layer): suspend if the driver says so (True)."""
        p = self.progress
        crossed = any(self._last_check < m <= p + 1e-12 for m in self.chunk_marks)
        self._last_check = p
        if not self.preempt_requested or self.check is None:
            return False
        self._resume_at = resume  # saved first: the driver may start another batch synchronously
        if self.check(2 if crossed else kind, p):
            self.preempt_requested = False
            return True
        self._resume_at = None
        return False

    def resume(self) -> None:
        """Called by the driver: continue where the last suspension stopped."""
        where, self._resume_at = self._resume_at, None
        if where is None:
            raise RuntimeError(f"batch {self.id}: resume without a suspension")
        if where[0] == "op":
            self._run_op(where[1], where[2])
        else:
            self._begin_layer(where[1])

    def _collective_part_done(self, k: int) -> None:
        self._coll_pending -= 1
        if self._coll_pending == 0:
            self._layer_cct += self.sim.queue.now - self._coll_start
            self._run_segment(k + 1)

    def _layer_done(self) -> None:
        j = self.layer
        self.cct.append(self._layer_cct)
        if self._p2d is None:
            self._p2d = self._p2d_shapes()
        done = self.compute_end is not None
        for s, nbytes, shape in self._p2d:
            s.add_bytes("p2d", nbytes)
            s.p2d_pending += self._issue(f"{s.id}.L{j}.p2d", shape, j, s.deadline, 0.0, s.id, self.tag, j, done,
                                         self.flows, self._p2d_done, s)
        if j + 1 < self.num_layers:
            if self.check is not None:
                self._work = (j + 1) * self.plan.compute  # exact at a layer end (no float drift)
                if self._boundary(1, ("layer", j + 1)):
                    return
            self._begin_layer(j + 1)
            return
        now = self.sim.queue.now
        self.compute_end = now
        for f in self.flows.values():
            f.compute_done = True
        for s in self.states:
            s.compute_end = now
            s.stall = self.stall + sum(self.cct)
        self.sim.network.reschedule(self.flows.values())
        self.sim.compute_done(self)
        for s in self.states:
            if s.p2d_pending == 0:
                self.sim.request_done(s, now)

    def _p2d_done(self, state: RequestState) -> None:
        state.p2d_pending -= 1
        if state.p2d_pending == 0 and state.compute_end is not None:
            self.sim.request_done(state, self.sim.queue.now)

    # -- flows ------------------------------------------------------------------------

    def _p2d_shapes(self) -> list[tuple[RequestState, float, Shape]]:
        """Per request: the network bytes of one layer's KV to its decode unit, and that transfer's shape."""
        runner, cluster, move = self.sim.runner, self.sim.cluster, self._fabric.move
        kv = runner.kv_transfer_bytes_per_token_per_layer
        out = []
        for s in self.states:
            decode = cluster.decode_units[s.route.decode]
            shape = move(Stage.P2D, s.input_tokens * kv, runner.kv_gpus(self.unit, s.rank),
                         runner.kv_gpus(decode, s.rank))
            out.append((s, shape.net, shape))
        return out
