"""The serving loop (:class:`ServingEngine`) and the instance engine, its iteration-level configuration.

:class:`ServingEngine` is the one event loop of every serving simulation:
requests arrive (one pending arrival at a time), a dispatcher places them,
instances step, prefill units (:mod:`.unit`) run their layer-by-layer
batches, KV moves and decodes. Two builders configure it:
:class:`InstanceEngine` here (from an ``InstanceSimConfig``) and the unit
engine, ``laxflow.sim.serving.simulator.ServingSimulator`` (from a
``ServingConfig``: the MFS experiments' prefill units, prefix-aware routing,
decode ``hold`` or decode instances).

Who calls: :func:`.run.run_instances` (``laxflow sim serve/sweep`` with a
batch scheduler in ``--prefill``, or ``--router``, ``--pools``,
``--instances``), ``bench/batching_repro.py`` and tests; everything runs on
one thread in one :class:`EventQueue`. What follows is the instance engine.

Per arrival the :class:`~.dispatch.Dispatcher` picks an instance
(``prefill_target``); a scheduler with admission control (``fairbatching-pab``:
``admits(views, now, new)``) may refuse it there, and the request is marked
``rejected`` (a miss in the metrics); else an idle instance starts a step at once. A step's batch
comes from the instance's batch scheduler (``laxflow.integrations.prefill``,
``create_batch_scheduler``) over ``SequenceView`` s; it lasts what the compute
model says (:mod:`.profile`); at its end every entry's token is emitted, then
the dispatcher hears ``after_step`` and the instance's report (the router's
``InstanceView``) is refreshed -- the only time it is: routers keep their own
view between reports, as in the papers -- then the next step starts. An instance whose
scheduler defers every sequence waits ``IDLE_POLL`` seconds and asks again
(an engine's busy loop). On a prefill-role instance a sequence whose prompt
completed leaves for ``decode_target``: its KV (the prompt's tokens) is one
P2D transfer through the run's :class:`~.fabric.Fabric` (``config.network``
``fabric``: one flow on ``laxflow.sim.network`` under the run's flow policy,
placed by :func:`~.fabric.instance_ports`: a non-blocking switch, one port
per instance at the NIC bandwidth (``cluster.nic_gbps``, else the
deployment's) times its GPUs; ``ideal``: it costs nothing and lands at
once) and joins the decode instance when the last
byte lands; the prefill instance holds that KV until then. With
``config.p2d`` ``layer`` the KV leaves instead layer by layer as each chunk's
step computes it (:mod:`.layers`: such a step is L layer events, ending at
the same time; the decode instance is asked at the prompt's first chunk) and
joins when the last layer of the last chunk lands. ``config.placement``
``cluster`` puts the instances on a ``ClusterConfig``'s servers and topology
(:func:`~.fabric.instance_cluster`) instead of one port each.

Pool managers (Arrow) plug in as a dispatcher: ``engine.instances`` (id ->
:class:`~.instance.Instance`, with ``role``, ``seqs``, ``kv_free()``,
``waiting()``, ``decoding()``, ``tokens_done``, ``busy``), ``engine.set_role(id,
role)`` between steps (the new role's scheduler forms the next batch;
resident sequences stay), ``engine.report(instance)`` and ``engine.queue.now``.
A new role takes effect at the instance's next step; sequences already on it
finish there (a prefill on an instance flipped to decode decodes locally).

With a prefill scheduler in ``config.scheduler`` (``--prefill fcfs|flowprefill|
edf-*`` and ``--instances P:D``) every prefill-role instance is a prefill unit
(:class:`~.unit.UnitInstance`): at arrival its route is fixed (the
dispatcher's decode instance), the unit's scheduler runs whole-prompt tasks
as batches of the deployment's layer plan (collectives and each layer's KV
as flows), a prompt's first token is emitted when its last layer is computed
and seen when its KV has landed, and it then decodes on its decode instance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from laxflow.errors import UserError
from laxflow.integrations.prefill.latency import LinearBatchModel
from laxflow.integrations.prefill.registry import create_batch_scheduler
from laxflow.integrations.routing.base import InstanceView, QueuedPrefill
from laxflow.integrations.routing.registry import create_router
from laxflow.policy.flow import Flow, Stage
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.serving.config import ClusterConfig
from laxflow.sim.serving.instances.config import InstanceSimConfig
from laxflow.sim.serving.instances.decode import DecodeAll
from laxflow.sim.serving.instances.dispatch import Dispatcher, RouterDispatcher
from laxflow.sim.serving.instances.fabric import create_fabric, instance_cluster, instance_ports
from laxflow.sim.serving.instances.instance import ROLES, Instance, Seq, check_kv_fits
from laxflow.sim.serving.instances.layers import Host, LayeredStep, Send
from laxflow.sim.serving.instances.profile import StepTimer, profile_samples
from laxflow.sim.serving.instances.unit import UnitInstance
from laxflow.sim.workload.request import Request
from laxflow.sim.workload.slo_traces import PRIORITY_WEIGHTS

KV_BLOCK = 16  # tokens per KV block in the routers' free-block counts (vLLM's default block size)


@dataclass
class InstanceResult:
    """What one run produced: every sequence (arrival order) and per-instance totals."""

    seqs: list[Seq]
    measured: list[Seq]
    instances: dict[str, dict[str, float]]
    w_p: float
    w_d: float
    p2d_bytes: float
    wall_s: float
    sim_time: float
    network_events: int
    extra: dict[str, Any] = field(default_factory=dict)


def output_tokens(request: Any) -> int:
    """A workload request's output tokens (0 when it gives none): what its decode produces or is held for."""
    return int(getattr(request, "output_tokens", 0) or 0)


def tdg_weights(requests: Sequence[Request]) -> tuple[float, float]:
    """ProServe §5.1's rule, for every policy alike: w_p / w_d = mean input / mean output, w_d = 1."""
    mean_in = float(np.mean([r.input_tokens for r in requests]))
    mean_out = float(np.mean([max(1, r.output_tokens) for r in requests]))
    return mean_in / mean_out, 1.0


class ServingEngine:
    """The one serving loop (module docstring): requests arrive, a dispatcher places them, instances step,
    prefill units run their batches, KV moves and decodes, on one event queue and one flow-level network.

    A builder (a subclass: :class:`InstanceEngine` from an ``InstanceSimConfig``, the unit engine's
    :class:`~laxflow.sim.serving.simulator.ServingSimulator` from a ``ServingConfig``) sets its parts
    before ``_simulate``: ``queue``, ``network``, ``fabric``, ``seqs`` (arrival order), ``instances``,
    ``dispatcher``, ``progress``, ``timer`` and ``gpus`` (batch-scheduler instances' hand-offs),
    ``p2d_layer`` (they send per layer), ``hold`` (decode "hold": seconds per output token a request's
    decode unit stays held, with no decode steps; None: decode instances run), ``reporting`` (refresh the
    instances' reports after each step: routers and pool managers read them), and with prefill units
    :meth:`_start_units`, one :meth:`_add_unit` per unit and the decode instances' ids in ``_decode_unit``.
    The unit hooks (:meth:`unit_route`, :meth:`idle_ttft`, :meth:`unit_admitted`, :meth:`unit_computed`,
    :meth:`left_decode`) are where a builder's routing and caches plug in.
    """

    def _loop_state(self) -> None:
        """The loop's own counters and tables (a builder calls this first)."""
        self.queue = EventQueue()
        self.p2d_bytes = 0.0
        self.finished = 0
        self.rejected = 0
        self.p2d_flows: dict[int, Flow] = {}  # P2D flows on the network, by id(flow), until they land
        self._handed: dict[str, tuple[Instance, Instance]] = {}  # p2d "layer": prompt done, KV not landed yet
        self._reports: dict[str, InstanceView] = {}
        self.instances: dict[str, Any] = {}  # id -> Instance (or UnitInstance: prefill units)
        self.units: list[UnitInstance] = []  # prefill units, by their cluster unit's index
        self._decode_unit: dict[str, int] = {}  # with prefill units: decode instance id -> its decode unit index
        self.unit_states: dict[str, Any] = {}  # every request a prefill unit admitted (RequestState), by id
        self.p2d_layer = False
        self._layer_host: Host | None = None  # what layered steps use of this engine (built at the first)
        self.hold: float | None = None
        self.reporting = True

    def _start_units(self, runner: Any, cluster: Any, reuse_lookahead: int | None) -> None:
        """Prefill units will run on ``cluster`` with ``runner``'s layer plans, through the run's fabric."""
        from laxflow.sim.serving.batch import BatchContext, BatchRun

        self.runner = runner
        self.context = BatchContext(self.queue, self.network, runner, cluster, reuse_lookahead,
                                    self._unit_compute_done, self._unit_kv_landed, self.fabric)
        self.batches: list[BatchRun] = []
        self._index = {s.id: k for k, s in enumerate(self.seqs)}
        self._by_id = {s.id: s for s in self.seqs}
        self._requests: dict[str, Any] = {}  # id -> workload request (the builder fills it)

    def _add_unit(self, iid: str, spec: Any, scheduler: str, predictor: Any, budget: int,
                  pruned: Callable[[], set[str]] | None, kv: int) -> UnitInstance:
        """Prefill unit ``spec`` (a cluster unit) as instance ``iid`` over a fresh ``scheduler``."""
        from laxflow.sim.serving.layered_prefill import LayeredPrefill

        prefill = LayeredPrefill(self.context, spec, scheduler, predictor, budget, pruned, self._after_arrivals,
                                 self.batches)
        inst = UnitInstance(iid, prefill, kv)
        self.units.append(inst)
        self.instances[iid] = inst
        return inst

    # -- the pool manager's API ----------------------------------------------------

    def set_role(self, instance_id: str, role: str) -> None:
        """Give ``instance_id`` a new role from its next step (a pool manager's flip)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        inst = self.instances[instance_id]
        inst.role = role
        self._kick(inst)

    def report(self, inst: Instance) -> InstanceView:
        """``inst``'s last report: its state at the end of its last step (or at the start)."""
        return self._reports[inst.id]

    def place(self, seq: Seq, instance_id: str) -> None:
        """Put ``seq`` on ``instance_id`` now (dispatch); an idle instance starts a step."""
        inst = self.instances[instance_id]
        if seq.prefill_instance is None:
            seq.prefill_instance = instance_id
        if isinstance(inst, UnitInstance):
            self._unit_arrival(inst, seq)
            return
        inst.add(seq)
        self._kick(inst)

    def _simulate(self) -> float:
        """Run every request to its end; returns the wall seconds it took."""
        start = time.perf_counter()
        self.queue.push(self.seqs[0].arrival, Priority.ARRIVAL, self._arrive, 0)
        self.queue.run()
        if self.finished != len(self.seqs):
            raise RuntimeError(f"simulation ended with {len(self.seqs) - self.finished} requests unfinished")
        return time.perf_counter() - start

    def _arrive(self, k: int) -> None:
        if k + 1 < len(self.seqs):  # the next arrival (one pending at a time)
            self.queue.push(self.seqs[k + 1].arrival, Priority.ARRIVAL, self._arrive, k + 1)
        seq = self.seqs[k]
        now = self.queue.now
        target = self.dispatcher.prefill_target(self, seq, now)
        if target not in self.instances:
            raise RuntimeError(f"dispatcher sent {seq.id} to unknown instance {target!r}")
        inst = self.instances[target]
        scheduler = inst.schedulers[inst.role]
        if getattr(scheduler, "admission", False) and not scheduler.admits(
                [s.view() for s in inst.seqs.values()], now, seq.view()):
            # Admission control (fairbatching-pab): refused, counted as an SLO miss by the metrics.
            seq.rejected = True
            seq.prefill_instance = target
            self.rejected += 1
            self._finish(seq)
            return
        self.place(seq, target)

    def _kick(self, inst: Instance) -> None:
        inst.kick(self.queue, self._step_end, self._layered if self.p2d_layer else None)

    def _layered(self, inst: Instance, secs: float) -> bool:
        """A prefill-role step that sends KV runs layer by layer (layers.py; it ends in _step_end at the
        same time); any other step is one event."""
        sends = self._layer_sends(inst) if inst.role == "prefill" else None
        if sends:
            if self._layer_host is None:  # (the network and fabric are built by then)
                self._layer_host = Host(self.queue, self.timer.model.num_layers, self.fabric.issue,
                                        self.network.reschedule, self._layer_landed, self._step_end)
            LayeredStep(self._layer_host, inst, secs, sends).begin()
        return bool(sends)

    def _step_end(self, inst: Instance) -> None:
        now = self.queue.now
        prefilled, finished = inst.end_step(now)
        if inst.role == "prefill":
            step = f"{inst.id}.s{inst.steps - 1}"  # the flow policy's batch: the step that finished the prompt
            for s in prefilled:
                if not s.done:
                    (self._hand_off_layered if self.p2d_layer else self._hand_off)(inst, s, now, step)
        elif self.p2d_layer:
            for s in prefilled:  # the role changed during the step: it decodes here, its KV stays
                s.p2d_target, s.p2d_sent = None, 0
        for s in finished:
            self._finish(s)
        self.dispatcher.after_step(self, inst, now)
        self._refresh(inst)
        self._kick(inst)

    def _hand_off(self, src: Instance, seq: Seq, now: float, step: str) -> None:
        target = self.dispatcher.decode_target(self, seq, now)
        if target == src.id:
            return
        dst = self.instances[target]
        del src.seqs[seq.id]
        src.outbound[seq.id] = seq
        seq.decode_instance = target
        size = float(seq.kv_tokens * self.timer.kv_bytes_per_token())
        self.p2d_bytes += size
        # The whole prompt's KV after its last chunk (no layer, nothing downstream, compute done).
        shape = self.fabric.move(Stage.P2D, size, self.gpus[src.id], self.gpus[dst.id])
        self.fabric.issue(f"{seq.id}.kv", shape, None, seq.arrival + seq.ttft_slo, 0.0, seq.id, step, None, True,
                          self.p2d_flows, self._kv_landed, (seq, src, dst))

    # -- per-layer P2D (p2d "layer", layers.py) ------------------------------------

    def _layer_sends(self, inst: Instance) -> list[Send]:
        """The KV the step just formed on prefill-role ``inst`` sends, per chunk (empty: a one-event step).

        A chunk's decode instance is asked of the dispatcher at the prompt's
        first layered chunk (in "prompt" mode: after its last chunk), so a
        router or pool manager decides on the reports of that time. A request
        that ends with its first token moves no KV (as in "prompt" mode).
        """
        assert inst.batch is not None
        now = self.queue.now
        per_token = self.timer.kv_bytes_per_token()
        layers = self.timer.model.num_layers
        sends: list[Send] = []
        for e in inst.batch.entries:
            if not e.is_prefill:
                continue
            s = inst.seqs[e.id]
            if s.outputs + 1 >= s.target_outputs:
                continue
            if s.p2d_target is None:
                s.p2d_target = self.dispatcher.decode_target(self, s, now)
            if s.p2d_target == inst.id:
                continue
            end = s.computed + e.new_tokens
            size = float((end - s.p2d_sent) * per_token)  # this chunk, and KV of earlier steps that sent none
            if size <= 0:
                continue
            s.p2d_sent = end
            self.p2d_bytes += size
            shape = self.fabric.move(Stage.P2D, size / layers, self.gpus[inst.id], self.gpus[s.p2d_target])
            sends.append(Send(s, shape, end >= s.prompt_tokens))
        return sends

    def _hand_off_layered(self, src: Instance, seq: Seq, now: float, step: str) -> None:
        """``seq``'s prompt ended on prefill-role ``src``: hold its KV until its last layer lands."""
        target = seq.p2d_target
        if target is None or target == src.id:  # no layered chunk sent it anywhere: ask now, as "prompt" mode
            target = self.dispatcher.decode_target(self, seq, now)
            if target == src.id:
                seq.p2d_target, seq.p2d_sent = None, 0
                return
        dst = self.instances[target]
        del src.seqs[seq.id]
        src.outbound[seq.id] = seq
        seq.decode_instance = target
        self._handed[seq.id] = (src, dst)
        rest = seq.kv_tokens - seq.p2d_sent  # KV no layered chunk sent (steps under another role)
        if rest > 0:
            size = float(rest * self.timer.kv_bytes_per_token())
            self.p2d_bytes += size
            seq.p2d_sent = seq.kv_tokens
            shape = self.fabric.move(Stage.P2D, size, self.gpus[src.id], self.gpus[dst.id])
            seq.p2d_pending += self.fabric.issue(f"{seq.id}.kv", shape, None, seq.arrival + seq.ttft_slo, 0.0, seq.id,
                                                 step, None, True, seq.p2d_live, self._layer_landed, seq)
        if seq.p2d_pending == 0:  # everything landed already: join the decode instance after this event
            self.queue.push(now, Priority.COMPLETION, self._land, seq)

    def _layer_landed(self, seq: Seq) -> None:
        seq.p2d_pending -= 1
        if seq.p2d_pending == 0 and seq.id in self._handed:
            self._land(seq)

    def _land(self, seq: Seq) -> None:
        src, dst = self._handed.pop(seq.id)
        seq.p2d_target, seq.p2d_sent = None, 0
        self._kv_landed((seq, src, dst))

    def _kv_landed(self, moved: tuple[Seq, Instance, Instance]) -> None:
        seq, src, dst = moved
        self._seen(seq, self.queue.now)
        del src.outbound[seq.id]
        self._kick(src)  # freed KV may let a deferred prefill in
        self.place(seq, dst.id)

    @staticmethod
    def _seen(seq: Seq, now: float) -> None:
        """``seq``'s KV landed at ``now``: its first token reaches the user with it (TTFT ends at the last P2D
        byte, on the prefill units and the instances alike)."""
        seq.kv_landed = now
        if seq.token_times[0] < now:
            seq.token_times[0] = now

    # -- prefill units (config.prefill_units, instances/unit.py) ---------------------------

    def _after_arrivals(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` after every arrival of this instant (TIMER runs after ARRIVAL at equal times)."""
        self.queue.push(self.queue.now, Priority.TIMER, lambda _: fn(), None)

    def _unit_arrival(self, inst: UnitInstance, seq: Seq) -> None:
        """``seq`` reached prefill unit ``inst``: its route (decode instance, reuse) is fixed now."""
        from laxflow.sim.serving.request_state import RequestState

        route = self.unit_route(inst, seq)
        state = self.unit_states[seq.id] = RequestState(self._requests[seq.id], self._index[seq.id], route,
                                                         seq.ttft_slo, self.idle_ttft(seq))
        inst.admit(seq, state)
        self.unit_admitted(state)

    def unit_route(self, inst: UnitInstance, seq: Seq) -> Any:
        """The ``router.Route`` of ``seq`` on prefill unit ``inst`` (a builder may route otherwise): the
        dispatcher's decode instance, nothing reused (the instance engine keeps no prefix cache)."""
        from laxflow.sim.serving.router import Route

        target = self.dispatcher.decode_target(self, seq, self.queue.now)
        if target not in self._decode_unit:
            raise RuntimeError(f"dispatcher sent the KV of {seq.id} to {target!r}, which is not a decode instance")
        seq.decode_instance = target
        return Route(inst.prefill.unit.index, self._decode_unit[target], 0, 0, None)

    def idle_ttft(self, seq: Seq) -> float:
        """``seq``'s TTFT alone on the idle cluster, for its request state (0.0: not modelled)."""
        return 0.0

    def unit_admitted(self, state: Any) -> None:
        """A builder's hook: ``state`` is on its prefill unit (its attention-DP rank set)."""

    def unit_computed(self, batch: Any) -> None:
        """A builder's hook: a prefill unit's ``batch`` computed its last layer (before its next task starts)."""

    def left_decode(self, seq: Seq) -> None:
        """A builder's hook: ``seq`` has left its decode instance (or, decode "hold", its hold ended)."""

    def _unit_compute_done(self, batch: Any) -> None:
        """A unit's batch computed its last layer: its prompts' first tokens; the unit's next task."""
        inst = self.units[batch.unit.index]
        now = self.queue.now
        self.unit_computed(batch)
        for state in batch.states:
            inst.computed(self._by_id[state.id], now)
        inst.steps += 1
        inst.busy_seconds += batch.plan.compute * batch.num_layers + batch.stall + sum(batch.cct)
        inst.driver.compute_done(batch)
        self.dispatcher.after_step(self, inst, now)
        self._refresh(inst)

    def _unit_kv_landed(self, state: Any, now: float) -> None:
        """The last P2D byte of ``state``'s prompt landed: its first token is seen; it decodes."""
        seq = self._by_id[state.id]
        self.units[state.route.prefill].landed(seq)
        state.finish = now
        self._seen(seq, now)
        self.p2d_bytes += seq.prompt_tokens * self.runner.kv_transfer_bytes_per_token_per_layer * self.runner.num_layers
        if self.hold is not None:  # decode "hold": done here; its decode unit is held for its outputs' time
            self._finish(seq, left=False)
            self.queue.push(now + output_tokens(self._requests[seq.id]) * self.hold, Priority.TIMER,
                            self.left_decode, seq)
            return
        if seq.done:  # its one token was the first
            self._finish(seq)
            return
        self.place(seq, seq.decode_instance)

    def _finish(self, seq: Seq, left: bool = True) -> None:
        self.finished += 1
        if left:
            self.left_decode(seq)
        if self.progress is not None:
            self.progress(1)

    def _refresh(self, inst: Instance) -> None:
        if not self.reporting:
            return
        queue = tuple(QueuedPrefill(s.id, s.prompt_tokens - s.computed,
                                    s.arrival + s.ttft_slo + s.outputs * s.tpot_slo, s.weight)
                      for s in inst.seqs.values() if s.is_prefill)
        decoding = len(inst.seqs) - len(queue)
        at = self.queue.now
        self._reports[inst.id] = InstanceView(
            inst.id, waiting=len(queue), running=decoding, pab=inst.pab, reported_at=at, prefill_queue=queue,
            queue_updated_at=at, decoding=decoding, free_kv_blocks=max(0, inst.kv_free()) // KV_BLOCK)


class InstanceEngine(ServingEngine):
    """One run: builds the instances, router and network from ``config``; ``run()`` simulates it."""

    def __init__(self, config: InstanceSimConfig, requests: Sequence[Request], flow_policy: Any = None,
                 dispatcher: Dispatcher | None = None, progress: Callable[[int], None] | None = None) -> None:
        if not requests:
            raise UserError("workload: no requests to simulate")
        self.config = config
        self._loop_state()
        self.progress = progress
        self.p2d_layer = config.p2d == "layer"
        self.timer = StepTimer(config.deployment)
        self.samples = profile_samples(config.deployment)
        kv = config.kv_tokens or self.timer.kv_capacity_tokens(config.gpu_memory_utilization)
        if kv < 1:
            raise UserError(f"deployment {config.deployment!r}: the weights leave no GPU memory for KV "
                            f"(gpu_memory_utilization {config.gpu_memory_utilization})")
        self.w_p, self.w_d = (config.w_p, 1.0) if config.w_p is not None else tdg_weights(requests)
        self.seqs = [self._seq(r) for r in sorted(requests, key=lambda r: r.arrival)]
        for s in self.seqs:
            check_kv_fits(s.id, s.prompt, s.target_outputs, kv, "one instance", config.deployment)
        roles = [(f"i{k}", "colocated" if not config.disaggregated else
                  ("prefill" if k < config.prefill_instances else "decode")) for k in range(config.instances)]
        if config.prefill_units:
            self._network(flow_policy, roles)
            self._build_units(roles, kv, requests)
        else:
            for iid, role in roles:
                self.instances[iid] = Instance(iid, role, self._schedulers(), kv, self.timer)
        self.dispatcher = dispatcher if dispatcher is not None else self._router_dispatcher()
        for inst in self.instances.values():
            if isinstance(self.dispatcher, RouterDispatcher):
                self.dispatcher.after_step(self, inst, 0.0)  # the empty instance's first report (its PAB)
            self._refresh(inst)
        if not config.prefill_units:
            self._network(flow_policy, roles)

    # -- construction ------------------------------------------------------------

    def _seq(self, r: Request) -> Seq:
        weight = PRIORITY_WEIGHTS.get(r.category or "", 1.0)
        return Seq(r.id, float(r.arrival), int(r.input_tokens), max(1, int(r.output_tokens)), self.config.ttft_slo,
                   self.config.tpot_slo, weight)

    def _schedulers(self) -> dict[str, Any]:
        """One scheduler per role for one instance (fresh objects: some keep online corrections)."""
        c = self.config
        out: dict[str, Any] = {}
        for role in ROLES:
            if role == "decode":
                out[role] = DecodeAll()
                continue
            opts = dict(c.scheduler_options)
            if c.scheduler == "slidebatching":
                opts.setdefault("setting", "colocated" if role == "colocated" else "disaggregated")
                opts.setdefault("w_p", self.w_p)
                opts.setdefault("w_d", self.w_d)
            try:
                out[role] = create_batch_scheduler(c.scheduler, self.samples, **opts)
            except ValueError as exc:
                raise UserError(f"--prefill {c.scheduler}: {exc}") from None
        return out

    def _router_dispatcher(self) -> RouterDispatcher:
        c = self.config
        opts = dict(c.router_options)
        if c.router == "gorouting":
            opts.setdefault("setting", "disaggregated" if c.disaggregated else "colocated")
            opts.setdefault("w_p", self.w_p)
            opts.setdefault("w_d", self.w_d)
            opts.setdefault("seed", c.seed)
        try:
            router = create_router(c.router, self.samples, **opts)
        except ValueError as exc:
            raise UserError(f"--router {c.router}: {exc}") from None
        pab = LinearBatchModel.fit(self.samples) if c.router == "pab" else None
        return RouterDispatcher(router, pab, c.ttft_slo, c.tpot_slo)

    def _network(self, flow_policy: Any, roles: list[tuple[str, str]]) -> None:
        from laxflow.policy.registry import create_policy
        from laxflow.sim.network.engine import FluidNetwork

        dep = self.timer.dep
        if self.config.placement == "cluster":
            config = (self.config.cluster or ClusterConfig()).resolve(
                int(dep.gpus_per_node), float(dep.nic_gbps), float(dep.intra_node_gbps or 7200.0))
            cluster, self.gpus = instance_cluster(config, roles, int(dep.gpus))
            nvswitch = config.nvswitch_bytes_per_s
        else:
            nic = (self.config.cluster and self.config.cluster.nic_gbps) or dep.nic_gbps
            port = nic * 1e9 / 8 * dep.gpus  # every GPU's NIC carries its TP shard of the KV
            cluster, self.gpus = instance_ports([iid for iid, _ in roles], port)
            nvswitch = dep.intra_node_gbps * 1e9 / 8
        self.cluster = cluster
        self.topology = cluster.topology
        policy = flow_policy if flow_policy is not None else create_policy(self.config.flow_policy)
        self.network = FluidNetwork(self.topology, policy, self.queue, flow_fields=False)  # (no flow's level is read here)
        self.fabric = create_fabric(self.config.network, self.queue, self.network, cluster, nvswitch)

    # -- events ------------------------------------------------------------------

    def run(self) -> InstanceResult:
        wall = self._simulate()
        warm = min(self.config.warmup, len(self.seqs) - 1)
        stats = {i.id: {"role_end": i.role, "steps": i.steps, "busy_s": i.busy_seconds,
                        "preemptions": i.preemptions} for i in self.instances.values()}
        return InstanceResult(self.seqs, self.seqs[warm:], stats, self.w_p, self.w_d, self.p2d_bytes, wall,
                              self.queue.now, self.network.events)

    def _build_units(self, roles: list[tuple[str, str]], kv: int, requests: Sequence[Request]) -> None:
        """The prefill-role instances as prefill units of the deployment's layer plan, on the placed cluster
        and the run's fabric; the decode instances as usual (their roles are fixed: no pools)."""
        from laxflow.sim.serving.config import ServingConfig
        from laxflow.sim.serving.layered_prefill import check_scheduler, ttft_predictor
        from laxflow.sim.serving.plan import ModelRunner
        from laxflow.sim.serving.prefill_driver import PolicyHooks

        c = self.config
        runner = ModelRunner(self.timer.model.name, self.timer.dep)
        check_scheduler(c.scheduler, runner)
        self._start_units(runner, self.cluster, None)
        budget = int(c.scheduler_options.get("token_budget", ServingConfig.token_budget))
        predictor = ttft_predictor(self.runner, self.context, max(budget, max(s.prompt for s in self.seqs)))
        pruned = PolicyHooks(self.network.policy).pruned  # the flow policy's pruned set reaches the drivers
        self._requests = {str(r.id): r for r in requests}
        for iid, role in roles:
            if role == "prefill":
                self._add_unit(iid, self.cluster.prefill_units[len(self.units)], c.scheduler, predictor, budget,
                               pruned, kv)
            else:
                self._decode_unit[iid] = len(self._decode_unit)
                self.instances[iid] = Instance(iid, role, {"decode": DecodeAll()}, kv, self.timer)
