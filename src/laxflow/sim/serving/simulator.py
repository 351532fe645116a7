"""The serving simulator: disaggregated prefill/decode units coupled with the fluid network.

One :class:`ServingSimulator` runs one workload under one flow policy. Its
events and the network's share one :class:`~laxflow.sim.events.EventQueue`
(the one event order), so compute and communication interleave exactly and
a run is deterministic for a given workload.

Who calls what: at construction every request gets its SLO (:mod:`.slo`,
from the workload alone, the same for every policy). :meth:`run` walks the
request arrivals (one ARRIVAL event at a time); each arrival is routed
(:mod:`.router`) to its prefill unit, whose
:class:`~laxflow.sim.serving.prefill_driver.PrefillDriver` puts it on an
attention-DP rank and tells the unit's prefill scheduler (``--prefill``;
by default ``fcfs``: run-to-end batches, one per rank) after every arrival
of that instant; each task the scheduler starts is a
:class:`~laxflow.sim.serving.batch.BatchRun`, which calls back
:meth:`batch_compute_done` and :meth:`request_done` through its
:class:`~laxflow.sim.serving.batch.BatchContext`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from laxflow.errors import UserError, user_errors
from laxflow.policy.base import FlowPolicy
from laxflow.sim.events import EventQueue, Priority
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.batch import BatchContext, BatchRun
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ServingConfig
from laxflow.sim.serving.metrics import pruned_count
from laxflow.sim.serving.plan import ModelRunner
from laxflow.sim.serving.request_state import RequestState
from laxflow.sim.serving.router import GlobalRouter, PrefixCaches
from laxflow.sim.serving.slo import SloModel, workload_reuse


@dataclass
class SimResult:
    """What one run leaves behind: every request's state, every batch, and the network's counters."""

    policy: str
    states: list[RequestState]
    batches: list[BatchRun]
    warmup: int
    stage_bytes_delivered: dict[str, float]
    wall_s: float
    sim_time: float
    network_events: int
    cache_evictions: int
    prefill: str | None = None  # the --prefill scheduler (None: the default, fcfs)
    pruned: int | None = None  # requests in the flow policy's pruned set at the end (None: it keeps none)
    deferred: int | None = None  # tasks the --prefill drivers deferred as pruned (None: no driver ran)
    # decode "steps": each request's decode (an instances.instance.Seq, by request index); None: "hold"
    decode: dict[int, Any] | None = None

    @property
    def measured(self) -> list[RequestState]:
        return [s for s in self.states if s.index >= self.warmup]


class ServingSimulator:
    """One workload, one policy, one cluster."""

    def __init__(
        self,
        config: ServingConfig,
        requests: Sequence[Any],
        policy: str | FlowPolicy,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        config.validate()  # also done on construction; a caller may have mutated it since
        if not requests:
            raise UserError("workload: no requests to simulate")
        self.config = config
        self.requests = sorted(requests, key=lambda r: (float(r.arrival), str(r.id)))
        if isinstance(policy, str):
            from laxflow.policy.registry import create_policy

            with user_errors():
                self.policy = create_policy(policy)
            self.policy_name = policy
        else:
            self.policy = policy
            self.policy_name = type(policy).name or type(policy).__name__
        self.runner = ModelRunner(config.model, config.deployment, config.ep_comm, config.comm_share)
        dep = self.runner.deployment
        self.cluster_config = config.cluster.resolve(
            int(dep.gpus_per_node), float(dep.nic_gbps), float(dep.intra_node_gbps or 7200.0)
        )
        self.cluster = Cluster(self.cluster_config, self.runner.unit_gpus)
        self.queue = EventQueue()
        # The "ttft" dispatch reads the measured link load whatever the policy reads;
        # nothing here reads a flow's level, queue or DSCP (the results are per request and batch).
        self.network = FluidNetwork(self.cluster.topology, self.policy, self.queue,
                                    track_link_load=True if config.router_dispatch == "ttft" else None,
                                    flow_fields=False)
        self.caches = PrefixCaches(len(self.cluster.prefill_units), config.cache_tokens_per_unit, config.kv_placement)
        self.router = GlobalRouter(
            len(self.cluster.prefill_units), len(self.cluster.decode_units), self.caches, config.router_overlap_weight,
            config.remote_reuse,
        )
        self.slo = SloModel(self.runner, self.cluster, config.slo_scale)
        # Fixed before anything runs: the same per-request SLO under every policy.
        self.idle_ttfts = [self.slo.idle_ttft(int(r.input_tokens), reuse)
                           for r, reuse in zip(self.requests, workload_reuse(self.requests))]
        self.context = BatchContext(self.queue, self.network, self.runner, self.cluster, config.reuse_lookahead,
                                    self.batch_compute_done, self.request_done)
        self.batches: list[BatchRun] = []
        self.units = self._units()  # one per prefill unit
        self.drivers = [u.driver for u in self.units]
        self.decode_seqs: dict[int, Any] = {}  # decode "steps": request index -> its decode (instances.Seq)
        self._decoding: dict[str, RequestState] = {}  # decode "steps": on a decode unit now, by request id
        self.decode = self._decode_units() if config.decode == "steps" else None
        self.decode_tokens = [0.0] * len(self.cluster.decode_units)
        self.states: list[RequestState] = []
        self.done = 0
        self._progress = progress

    # -- run ---------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate every request to its last P2D byte; returns the result."""
        t0 = time.perf_counter()
        self.queue.push(float(self.requests[0].arrival), Priority.ARRIVAL, self._arrive, 0)
        self.queue.run()
        if self.done != len(self.requests):
            raise RuntimeError(f"simulation ended with {len(self.requests) - self.done} requests unfinished")
        return SimResult(
            policy=self.policy_name,
            states=self.states,
            batches=self.batches,
            warmup=min(self.config.warmup, len(self.requests) - 1),
            stage_bytes_delivered=dict(self.context.delivered),
            wall_s=time.perf_counter() - t0,
            sim_time=self.queue.now,
            network_events=self.network.events,
            cache_evictions=self.caches.evicted,
            prefill=self.config.prefill,
            pruned=pruned_count(self.policy),
            deferred=None if self.config.prefill is None else sum(d.deferrals for d in self.drivers),
            decode=None if self.decode is None else self.decode_seqs,
        )

    # -- events ------------------------------------------------------------------

    def _arrive(self, i: int) -> None:
        req = self.requests[i]
        if i + 1 < len(self.requests):
            self.queue.push(float(self.requests[i + 1].arrival), Priority.ARRIVAL, self._arrive, i + 1)
        block = int(req.block_size)
        if self.config.router_dispatch == "ttft":
            self.router.ttft_cost = self._ttft_cost(int(req.input_tokens), block)
        route = self.router.route(
            list(req.block_hashes), block, int(req.input_tokens),
            [d.queued_tokens for d in self.drivers], self.decode_tokens,
        )
        idle = self.idle_ttfts[i]
        state = RequestState(req, i, route, self._slo(req, idle), idle)
        self.states.append(state)
        self.decode_tokens[route.decode] += int(req.input_tokens)
        reused = list(req.block_hashes)[: -(-route.reused_tokens // block)]
        if route.local_tokens:
            self.caches.touch(route.prefill, reused)
        for holder, _, _ in route.fetches:
            self.caches.touch(holder, reused)
        self.drivers[route.prefill].arrival(state)  # on a rank now; its scheduler hears it at this instant's end
        if self.config.reuse_from == "routed":  # the prompt's blocks are reusable from its arrival (config.REUSE_FROM)
            self.caches.insert(route.prefill, req.block_hashes, block, state.rank)

    def _after_arrivals(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` after every arrival of this instant (TIMER runs after ARRIVAL at equal times),
        so simultaneous requests batch together."""
        self.queue.push(self.queue.now, Priority.TIMER, lambda _: fn(), None)

    def batch_compute_done(self, batch: BatchRun) -> None:
        """Called by a batch when its last layer's compute ends: cache its prompts, free the unit."""
        for s in batch.states:
            self.caches.insert(batch.unit.index, list(s.request.block_hashes), int(s.request.block_size), s.rank)
        self.drivers[batch.unit.index].compute_done(batch)

    # -- scheduler-driven prefill units (--prefill) --------------------------------

    def _slo(self, req: Any, idle: float) -> float:
        """Per-category SLO (qwen-multislo: FlowPrefill Table 2 x slo_scale) or slo_scale x idle TTFT."""
        category = getattr(req, "category", None)
        if category is not None:
            from laxflow.sim.workload.multislo import category_slo

            table = category_slo(self.config.model, category)
            if table is not None:
                return table * self.config.slo_scale
        return self.slo.slo(idle)

    def _predictor(self) -> Any:
        """The TTFT predictor (``layered_prefill.ttft_predictor``), built once."""
        if getattr(self, "_ttft_predictor", None) is None:
            from laxflow.sim.serving.layered_prefill import ttft_predictor

            top = max(self.config.token_budget, max(int(r.input_tokens) for r in self.requests))
            self._ttft_predictor = ttft_predictor(self.runner, self.context, top)
        return self._ttft_predictor

    def _ttft_cost(self, input_tokens: int, block: int) -> Callable[[int, int], float]:
        """Network-inclusive TTFT estimate per prefill unit for one request (router_dispatch "ttft")."""
        from laxflow.hooks.api import estimate_ttft
        from laxflow.protocol.hooks import Instance

        pred = self._predictor()
        p2d = input_tokens * self.runner.kv_transfer_bytes_per_token_per_layer * self.runner.num_layers
        topo, load = self.cluster.topology, self.network.link_load
        nic = self.cluster.config.nic_bytes_per_s

        def cost(u: int, cached_blocks: int) -> float:
            gpus = self.cluster.prefill_units[u].gpus
            kv_gpus = self.runner.kv_gpus(self.cluster.prefill_units[u], 0)
            port = f"p{u}"
            busy = max(float(load[topo.egress(g)]) for g in gpus)
            queued = self.drivers[u].queued_tokens
            inst = Instance(port, pred(queued) if queued > 0 else 0.0,
                            pred(max(1, input_tokens - cached_blocks * block)), p2d, port, nic * len(kv_gpus))
            est = estimate_ttft([inst], {port: nic * len(kv_gpus)}, {port: busy})
            return est[0].ttft_s if est else float("inf")

        return cost

    def _units(self) -> list[Any]:
        """One prefill unit per cluster unit, over the ``--prefill`` scheduler (default ``fcfs``, which needs no
        TTFT predictor and hears no pruned set: the units' plain run-to-end batches)."""
        from laxflow.sim.serving.layered_prefill import LayeredPrefill, check_scheduler
        from laxflow.sim.serving.prefill_driver import PolicyHooks

        name = self.config.prefill or "fcfs"
        check_scheduler(name, self.runner)
        predictor = self._predictor() if self.config.prefill else None
        hooks = PolicyHooks(self.policy) if self.config.prefill and self.config.prefill_coupling else None
        return [LayeredPrefill(self.context, spec, name, predictor, self.config.token_budget,
                               None if hooks is None else hooks.pruned, self._after_arrivals, self.batches)
                for spec in self.cluster.prefill_units]

    def request_done(self, state: RequestState, now: float) -> None:
        """Called when a request's last P2D byte lands: its TTFT ends; it decodes, then leaves its decode unit."""
        state.finish = now
        self.done += 1
        outputs = int(getattr(state.request, "output_tokens", 0) or 0)
        if self.decode is None:
            self.queue.push(now + outputs * self.config.decode_seconds_per_token, Priority.TIMER, self._leave_decode,
                            state)
        else:
            from laxflow.sim.serving.instances.instance import Seq

            # Its prompt's KV and its first token arrive together; the rest of its outputs decode there.
            seq = Seq(state.id, state.arrival, state.input_tokens, max(1, outputs), state.slo, math.inf,
                      computed=state.input_tokens, outputs=1, token_times=[now], prefill_end=state.compute_end,
                      kv_landed=now)
            self.decode_seqs[state.index] = seq
            if seq.done:
                self._leave_decode(state)
            else:
                self._decoding[seq.id] = state
                self.decode.join(state.route.decode, seq)
        if self._progress is not None:
            self._progress(1)

    def _decode_units(self) -> Any:
        from laxflow.sim.serving.instances.config import GPU_MEMORY_UTILIZATION
        from laxflow.sim.serving.instances.decode import DecodeUnits

        dep = self.runner.deployment
        sizes = {len(u.gpus) for u in self.cluster.decode_units}
        if sizes != {int(dep.gpus)}:
            raise UserError(f"--decode steps: a decode unit runs one replica of {dep.name!r} ({dep.gpus} GPUs), "
                            f"but the cluster's decode units have {', '.join(map(str, sorted(sizes)))} GPUs")
        units = DecodeUnits(self.queue, dep, len(self.cluster.decode_units), GPU_MEMORY_UTILIZATION,
                            lambda seq: self._leave_decode(self._decoding.pop(seq.id)))
        for r in self.requests:  # before anything runs: every request fits a unit's KV memory
            units.check(str(r.id), int(r.input_tokens), max(1, int(getattr(r, "output_tokens", 0) or 0)))
        return units

    def _leave_decode(self, state: RequestState) -> None:
        self.decode_tokens[state.route.decode] -= state.input_tokens

