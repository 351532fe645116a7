"""The unit engine: disaggregated prefill/decode units coupled with the fluid network.

One :class:`ServingSimulator` runs one workload under one flow policy. It is a
configuration of the serving loop
(:class:`~laxflow.sim.serving.instances.engine.ServingEngine`, the instance
engine's loop too): its events and the network's share one
:class:`~laxflow.sim.events.EventQueue` (the one event order), so compute and
communication interleave exactly and a run is deterministic for a given
workload.

What this configuration sets: the cluster's prefill and decode units
(:class:`~laxflow.sim.serving.cluster.Cluster`: prefill servers, then decode
servers); every request's SLO at construction (:mod:`.slo`, from the workload
alone, the same for every policy); one prefill unit per cluster unit
(:class:`~laxflow.sim.serving.instances.unit.UnitInstance` over
:class:`~laxflow.sim.serving.layered_prefill.LayeredPrefill`: the unit's
prefill scheduler, ``--prefill``, by default ``fcfs``: run-to-end batches, one
per rank); and itself as the loop's dispatcher: each arrival is routed
(:mod:`.router`, prefix caches) to its prefill unit, the unit's batch caches
its prompts when its compute ends. When a request's last P2D byte lands its
TTFT ends; then with ``decode = "steps"`` (the default) it decodes on its
decode unit, a decode instance of the loop (TPOT, TBT), with ``"hold"`` its
decode unit is held for its outputs' time (the router's load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from laxflow.errors import UserError, user_errors
from laxflow.policy.base import FlowPolicy, pruned_count
from laxflow.sim.network import FluidNetwork
from laxflow.sim.serving.batch import BatchRun
from laxflow.sim.serving.cluster import Cluster
from laxflow.sim.serving.config import ServingConfig
from laxflow.sim.serving.instances.engine import ServingEngine, output_tokens
from laxflow.sim.serving.instances.fabric import Fabric
from laxflow.sim.serving.instances.instance import Seq
from laxflow.sim.serving.plan import ModelRunner
from laxflow.sim.serving.request_state import RequestState
from laxflow.sim.serving.router import GlobalRouter, PrefixCaches, Route
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


class ServingSimulator(ServingEngine):
    """One workload, one policy, one cluster: the unit engine, a configuration of the serving loop."""

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
        self._loop_state()
        self.progress = progress
        self.reporting = False  # (no router here reads the instances' reports)
        # The "ttft" dispatch reads the measured link load whatever the policy reads;
        # nothing here reads a flow's level, queue or DSCP (the results are per request and batch).
        self.network = FluidNetwork(self.cluster.topology, self.policy, self.queue,
                                    track_link_load=True if config.router_dispatch == "ttft" else None,
                                    flow_fields=False)
        self.fabric = Fabric(self.queue, self.network, self.cluster, self.cluster.config.nvswitch_bytes_per_s)
        self.caches = PrefixCaches(len(self.cluster.prefill_units), config.cache_tokens_per_unit, config.kv_placement)
        self.router = GlobalRouter(
            len(self.cluster.prefill_units), len(self.cluster.decode_units), self.caches, config.router_overlap_weight,
            config.remote_reuse,
        )
        self.slo = SloModel(self.runner, self.cluster, config.slo_scale)
        # Fixed before anything runs: the same per-request SLO under every policy.
        self.idle_ttfts = [self.slo.idle_ttft(int(r.input_tokens), reuse)
                           for r, reuse in zip(self.requests, workload_reuse(self.requests))]
        self.seqs = [Seq(str(r.id), float(r.arrival), int(r.input_tokens), max(1, output_tokens(r)), self._slo(r, idle),
                         config.tpot_slo or math.inf) for r, idle in zip(self.requests, self.idle_ttfts)]
        self._start_units(self.runner, self.cluster, config.reuse_lookahead)
        self._requests = {s.id: r for s, r in zip(self.seqs, self.requests)}
        self.dispatcher = self
        kv = self._decode_units() if config.decode == "steps" else 0
        if config.decode == "hold":
            self.hold = config.decode_seconds_per_token
        self.drivers = [u.driver for u in self._units(kv)]  # one per prefill unit
        self.decode_tokens = [0.0] * len(self.cluster.decode_units)
        self._routes: dict[str, Route] = {}  # routed, not yet on its unit

    # -- run ---------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulate every request to its last P2D byte (and, decode "steps", its last token); returns the result."""
        wall = self._simulate()
        return SimResult(
            policy=self.policy_name,
            states=list(self.unit_states.values()),
            batches=self.batches,
            warmup=min(self.config.warmup, len(self.requests) - 1),
            stage_bytes_delivered=dict(self.fabric.delivered),
            wall_s=wall,
            sim_time=self.queue.now,
            network_events=self.network.events,
            cache_evictions=self.caches.evicted,
            prefill=self.config.prefill,
            pruned=pruned_count(self.policy),
            deferred=None if self.config.prefill is None else sum(d.deferrals for d in self.drivers),
            decode=None if self.hold is not None else dict(enumerate(self.seqs)),
        )

    # -- the loop's dispatcher and unit hooks ------------------------------------------

    def prefill_target(self, engine: Any, seq: Seq, now: float) -> str:
        """Route ``seq`` (prefix overlap and load, or the TTFT estimate): its prefill unit's id."""
        req = self._requests[seq.id]
        block = int(req.block_size)
        if self.config.router_dispatch == "ttft":
            self.router.ttft_cost = self._ttft_cost(int(req.input_tokens), block)
        route = self.router.route(
            list(req.block_hashes), block, int(req.input_tokens),
            [d.queued_tokens for d in self.drivers], self.decode_tokens,
        )
        self._routes[seq.id] = route
        self.decode_tokens[route.decode] += int(req.input_tokens)
        reused = list(req.block_hashes)[: -(-route.reused_tokens // block)]
        if route.local_tokens:
            self.caches.touch(route.prefill, reused)
        for holder, _, _ in route.fetches:
            self.caches.touch(holder, reused)
        return self.units[route.prefill].id

    def decode_target(self, engine: Any, seq: Seq, now: float) -> str:
        return str(seq.decode_instance)

    def after_step(self, engine: Any, instance: Any, now: float) -> None:
        """(Nothing to monitor: routing reads the drivers' queues and the decode units' tokens.)"""

    def unit_route(self, inst: Any, seq: Seq) -> Route:
        route = self._routes.pop(seq.id)
        seq.decode_instance = f"d{route.decode}"
        return route

    def idle_ttft(self, seq: Seq) -> float:
        return self.idle_ttfts[self._index[seq.id]]

    def unit_admitted(self, state: RequestState) -> None:
        if self.config.reuse_from == "routed":  # the prompt's blocks are reusable from its arrival (config.REUSE_FROM)
            req = state.request
            self.caches.insert(state.route.prefill, req.block_hashes, req.block_size, state.rank)

    def unit_computed(self, batch: Any) -> None:
        """A batch computed its last layer: its unit caches the prompts."""
        for s in batch.states:
            self.caches.insert(batch.unit.index, list(s.request.block_hashes), int(s.request.block_size), s.rank)

    def left_decode(self, seq: Seq) -> None:
        self.decode_tokens[self.unit_states[seq.id].route.decode] -= seq.prompt

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

    def _units(self, kv: int) -> list[Any]:
        """One prefill unit per cluster unit, over the ``--prefill`` scheduler (default ``fcfs``, which needs no
        TTFT predictor and hears no pruned set: the units' plain run-to-end batches)."""
        from laxflow.sim.serving.layered_prefill import check_scheduler
        from laxflow.sim.serving.prefill_driver import PolicyHooks

        name = self.config.prefill or "fcfs"
        check_scheduler(name, self.runner)
        predictor = self._predictor() if self.config.prefill else None
        hooks = PolicyHooks(self.policy) if self.config.prefill and self.config.prefill_coupling else None
        return [self._add_unit(f"p{spec.index}", spec, name, predictor, self.config.token_budget,
                               None if hooks is None else hooks.pruned, kv)
                for spec in self.cluster.prefill_units]

    def _decode_units(self) -> int:
        """Decode "steps": one decode instance per decode unit (a replica of the deployment, vLLM's KV sizing,
        continuous decode batches); returns a unit's KV tokens."""
        from laxflow.sim.serving.instances.config import GPU_MEMORY_UTILIZATION
        from laxflow.sim.serving.instances.decode import DecodeAll
        from laxflow.sim.serving.instances.instance import Instance, check_kv_fits
        from laxflow.sim.serving.instances.profile import StepTimer

        dep = self.runner.deployment
        sizes = {len(u.gpus) for u in self.cluster.decode_units}
        if sizes != {int(dep.gpus)}:
            raise UserError(f"--decode steps: a decode unit runs one replica of {dep.name!r} ({dep.gpus} GPUs), "
                            f"but the cluster's decode units have {', '.join(map(str, sorted(sizes)))} GPUs")
        self.timer = StepTimer(dep)
        kv = self.timer.kv_capacity_tokens(GPU_MEMORY_UTILIZATION)
        if kv < 1:
            raise UserError(f"--decode steps: deployment {dep.name!r} leaves no GPU memory for KV")
        for s in self.seqs:  # before anything runs: every request fits a unit's KV memory
            check_kv_fits(s.id, s.prompt, s.target_outputs, kv, "a decode unit", dep.name,
                          "--decode hold runs no decode, so it does not need the memory")
        for unit in self.cluster.decode_units:
            iid = f"d{unit.index}"
            self._decode_unit[iid] = unit.index
            self.instances[iid] = Instance(iid, "decode", {"decode": DecodeAll()}, kv, self.timer)
        return kv
