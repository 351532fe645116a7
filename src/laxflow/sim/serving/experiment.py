"""Experiments: every policy on the same workload, rate sweeps, and the paper's presets.

Called by ``laxflow sim serve`` / ``laxflow sim sweep`` (:mod:`laxflow.sim.serve_cli`),
by ``bench/sim.py`` and by tests. One :class:`RunSpec` is one simulation (a
policy at a rate); it is plain data, so runs go to worker processes
(``concurrent.futures``) or to a Ray cluster unchanged. Every run of one
experiment rebuilds the same workload from the same seed, so policies are
compared on identical requests.

Rate: requests/s per prefill GPU (the paper's "per-GPU request rate"); the
cluster-wide arrival rate is that times the prefill GPUs actually used by
prefill units.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from laxflow.errors import UserError, user_errors
from laxflow.sim.serving.config import ClusterConfig, ServingConfig

ALL_POLICIES = ("fs", "sjf", "edf", "karuna", "mfs")

# Most requests (measured + warm-up) one run may hold. A run keeps every
# request's state (with its block hashes) in memory until it ends, and
# bench/sim.py measured about 28 requests/s at paper scale on the 2-core dev
# box (README "Benchmarks"), so a million is already about ten hours; more
# is refused rather than left to grow memory without bound.
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a serving config, a workload, a rate, a policy."""

    config: ServingConfig
    workload: str
    rate: float  # requests/s per prefill GPU; 0 with a trace: keep its timestamps
    policy: str
    requests: int  # measured requests (warm-up comes on top)
    seed: int = 0
    trace: str | None = None
    trace_format: str | None = None
    time_scale: float = 1.0  # rate 0 with a trace: its timestamps divided by this (bursts kept)
    per_request: bool = False  # also return one row per measured request (``request_rows``)
    prefill: str | None = None  # --prefill: the integrations.prefill scheduler of every prefill unit
    router: str | None = None  # --router: instance engine (serving/instances) request router
    pools: str | None = None  # --pools: instance engine pool manager
    instances: str | None = None  # --instances: "N" colocated or "P:D" (instance engine)
    network: str = "fabric"  # --network: fabric or ideal (instance engine; the unit-level engine is always fabric)
    p2d: str = "prompt"  # --p2d: prompt or layer (instance engine; the unit-level engine sends per layer)
    placement: str = "ports"  # --placement: ports or cluster (instance engine; the unit-level engine: cluster)
    prompt_scale: float = 1.0  # synthetic workload's prompt lengths x this (laxflow sim map --prompt-scales)

    @property
    def label(self) -> str:
        return "+".join(x for x in (self.prefill, self.router, self.pools, self.policy) if x)


@dataclass(frozen=True)
class Preset:
    """A named experiment (the paper's figures, the demo). Flags given on the command line override it."""

    name: str
    description: str
    model: str
    workload: str
    rates: tuple[float, ...]  # the sweep; ``serve`` uses the last (highest) one
    servers: int = 256
    topology: str = "fat-tree"
    deployment: str | None = None
    policies: tuple[str, ...] = ALL_POLICIES
    requests: int = 1024
    warmup: int = 512
    slo_scale: float = 3.0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    gpus_per_server: int | None = None  # None: the deployment's node (FlowPrefill's 1P1D: one unit per server)

    def config(self) -> ServingConfig:
        return ServingConfig(
            model=self.model,
            deployment=self.deployment,
            cluster=ClusterConfig(servers=self.servers, topology=self.topology, gpus_per_server=self.gpus_per_server),
            slo_scale=self.slo_scale,
            warmup=self.warmup,
        )


_MOE = {"mixtral": "mixtral-8x22b", "dbrx": "dbrx", "qwen-coder": "qwen3-coder", "grok": "grok-2"}

# Load normalization of the presets. The paper sweeps absolute per-GPU rates
# whose scale depends on its own profiled latencies; ours come from the
# roofline compute model, so the same absolute rate idles one model and
# swamps another. Each preset instead sweeps LOAD_FRACTIONS of the model's
# capacity on its workload: the per-GPU request rate at which one prefill
# unit alone, batching per rank as the simulator does, computing every prompt
# in full, with its all-to-alls on an idle fabric, is busy 99 % of the time.
# Printed by ``bench/capacity.py`` (method: laxflow.sim.serving.capacity,
# 32 servers (the testbed's model: the testbed), 1000 requests, seed 0);
# they are inputs, the same for every policy.
CAPACITY = {
    ("mixtral-8x22b", "qwen-conv"): 0.812, ("dbrx", "qwen-conv"): 0.781, ("qwen3-coder", "qwen-conv"): 0.267,
    ("grok-2", "qwen-conv"): 0.198, ("mixtral-8x22b", "qwen-agent"): 2.06, ("dbrx", "qwen-agent"): 2.04,
    ("qwen3-coder", "qwen-agent"): 0.926, ("grok-2", "qwen-agent"): 0.557, ("llama3-8b", "mooncake-conv"): 0.485,
    ("llama3-8b", "mooncake-agent"): 1.13, ("mixtral-8x7b", "qwen-conv"): 0.534, ("mixtral-8x7b", "qwen-agent"): 1.35,
}
# From 0.3: the capacity is a 99 %-busy rate with every prompt computed in full, so below
# about 0.6 every policy meets most SLOs; contention (and any policy margin) shows at 0.7-0.8.
LOAD_FRACTIONS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def rates_at(model: str, workload: str, fractions: tuple[float, ...] = LOAD_FRACTIONS,
             physics: str = "faithful") -> tuple[float, ...]:
    """Per-GPU rates at these fractions of the model's capacity on the workload (2 significant digits).

    ``physics`` other than "faithful" (``config.parse_physics``): the capacity under that physics,
    computed the way ``CAPACITY`` was (:func:`physics_capacity`), so a load fraction means the same under both.
    """
    from laxflow.sim.serving.config import parse_physics, physics_name

    physics = physics_name(parse_physics(physics))
    cap = CAPACITY[(model, workload)] if physics == "faithful" else physics_capacity(model, workload, physics)
    return tuple(float(f"{cap * f:.2g}") for f in fractions)


@functools.lru_cache(maxsize=None)
def physics_capacity(model: str, workload: str, physics: str) -> float:
    """``CAPACITY[(model, workload)]``'s method under ``physics`` (capacity.PAIRS' cluster; about a second
    per physics' step model)."""
    from laxflow.sim.serving.capacity import PAIRS, capacity

    if (model, workload) not in PAIRS:
        raise UserError(f"no capacity method for model {model!r} on workload {workload!r} "
                        f"(pairs: {', '.join(f'{m}/{w}' for m, w in PAIRS)})")
    return round(capacity(model, workload, physics=physics, **PAIRS[(model, workload)]).per_gpu_rate, 3)


# The instance-engine flags a preset may carry in ``extra`` (command-line flags override them).
ENGINE_PRESET_KEYS = ("prefill", "router", "pools", "instances")

# FairBatching (paper 004 §5) and ProServe (paper 003 §5) on the instance engine: Llama3-8B TP1 on one
# A800 per instance (FairBatching's Table 1 model), vLLM's KV sizing, every policy with its defaults.
# Rates are requests/s per instance, the same grid for every system of a preset (bench/batching_repro.py
# runs the same configurations and prints the claims). ``extra`` carries the engine flags.
# FairBatching's metric: peak effective RPS (rate x envelope attainment); fairbatching-pab rejects at
# admission (a rejected request is a miss). ProServe's: TDG ratio and SLO attainment, per priority.
PROSERVE_SCHEDULERS = "slidebatching,vllm,weighted-vtc,sarathi,priority,fairbatching"


def _batching_presets() -> list[Preset]:
    common = dict(model="llama3-8b", deployment="llama3-8b-tp1-a800", policies=("fs",))
    return [
        Preset("fairbatching-single", "FairBatching Fig. 5/Table 3-4: 1 x Llama3-8B TP1 (A800), QwenTrace (500/50 "
               "ms); sarathi, vllm (vanilla), fairbatching, fairbatching-pab (admission control)", workload="qwen-trace",
               rates=(4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0), requests=500, warmup=100,
               extra={"prefill": "sarathi,vllm,fairbatching,fairbatching-pab", "router": "dplb", "instances": "1"},
               **common),
        Preset("fairbatching-cluster", "FairBatching Fig. 8: 8 x Llama3-8B TP1 data-parallel, QwenTrace; {vllm, "
               "sarathi, fairbatching} x {dplb (request count), pab (prefill admission budget)}", workload="qwen-trace",
               rates=(8.0, 10.0, 12.0, 14.0, 16.0), requests=800, warmup=160,
               extra={"prefill": "vllm,sarathi,fairbatching", "router": "dplb,pab", "instances": "8"}, **common),
        Preset("proserve-single", "ProServe Fig. 10/13: 1 colocated Llama3-8B TP1, QwenTrace with priorities 2/1; "
               "slidebatching vs vllm, weighted-vtc, sarathi, priority, fairbatching", workload="qwen-trace",
               rates=(8.0, 10.0, 12.0), requests=300, warmup=60,
               extra={"prefill": PROSERVE_SCHEDULERS, "router": "dplb", "instances": "1"}, **common),
        Preset("proserve-colocated", "ProServe Fig. 12: 4 PD-colocated Llama3-8B TP1, QwenTrace with priorities; "
               "every local scheduler x {gorouting, minload}", workload="qwen-trace", rates=(8.0, 10.0, 12.0),
               requests=400, warmup=80,
               extra={"prefill": PROSERVE_SCHEDULERS, "router": "gorouting,minload", "instances": "4"}, **common),
        Preset("proserve-disaggregated", "ProServe Fig. 11: 2 prefill + 2 decode Llama3-8B TP1, QwenTrace with "
               "priorities; {slidebatching, sarathi} x {gorouting, minload}", workload="qwen-trace",
               rates=(3.0, 5.0), requests=600, warmup=120,
               extra={"prefill": "slidebatching,sarathi", "router": "gorouting,minload", "instances": "2:2"},
               **common),
    ]


def _presets() -> dict[str, Preset]:
    out = [
        Preset("demo", "16 servers x 8 A100 (2 Mixtral-8x22B TP4 EP8 prefill units), QwenA conversation, all five "
               "policies", "mixtral-8x22b", "qwen-conv", rates=rates_at("mixtral-8x22b", "qwen-conv"), servers=16,
               requests=200, warmup=100),
        Preset("testbed-qwenA", "Fig. 9: testbed, Mixtral-8x7B TP1 EP8 on RTX 3090, 16 prefill GPUs, 50 Gbps/GPU, "
               "QwenA conversation", "mixtral-8x7b", "qwen-conv", rates=rates_at("mixtral-8x7b", "qwen-conv"),
               servers=8, topology="testbed", deployment="testbed-mixtral-8x7b"),
        Preset("testbed-qwenB", "Fig. 9: testbed, as testbed-qwenA with QwenB agent", "mixtral-8x7b", "qwen-agent",
               rates=rates_at("mixtral-8x7b", "qwen-agent"), servers=8, topology="testbed",
               deployment="testbed-mixtral-8x7b"),
        Preset("fig12-conv", "Fig. 12a: Llama3-8B TP4 SP4, Mooncake conversation", "llama3-8b", "mooncake-conv",
               rates=rates_at("llama3-8b", "mooncake-conv")),
        Preset("fig12-agent", "Fig. 12b: Llama3-8B TP4 SP4, Mooncake agent", "llama3-8b", "mooncake-agent",
               rates=rates_at("llama3-8b", "mooncake-agent")),
        Preset("fig13", "Fig. 13: DBRX, QwenA conversation: CCT and earliness breakdown", "dbrx",
               "qwen-conv", rates=rates_at("dbrx", "qwen-conv")),
    ]
    # FlowPrefill §6 (its Tables 1-2): DistServe 1P1D -- ONE prefill instance (Llama3-8B TP1, Qwen2.5-14B TP2,
    # Llama3-70B TP4 on A800s) and one decode instance, so each "server" holds one unit; a cluster of 8
    # units behind our load-aware router would hide FCFS's head-of-line blocking (a short request goes to
    # an idle unit), which the paper's single instance cannot. The multi-SLO workload, SLO = Table 2 x
    # --slo-scale (1). Rates are per prefill GPU (instance rate / GPUs). The network policy hardly matters
    # here (only P2D crosses the network); compare prefill schedulers with --prefill.
    for model, dep, gpus in (("llama3-8b", "llama3-8b-tp1-a800", 1), ("qwen2.5-14b", "qwen2.5-14b", 2),
                             ("llama3-70b", "llama3-70b", 4)):
        out.append(Preset(f"flowprefill-{model}", f"FlowPrefill Fig. 9: {model} on A800 (1P1D), qwen-multislo",
                          model, "qwen-multislo", rates=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0), servers=2, deployment=dep,
                          policies=("fs",), requests=1000, warmup=200, slo_scale=1.0, gpus_per_server=gpus))
    out.extend(_batching_presets())
    for short, model in _MOE.items():
        out.append(Preset(f"fig10-{short}", f"Fig. 10: {model}, QwenA conversation", model, "qwen-conv",
                          rates=rates_at(model, "qwen-conv")))
        out.append(Preset(f"fig11-{short}", f"Fig. 11: {model}, QwenB agent", model, "qwen-agent",
                          rates=rates_at(model, "qwen-agent")))
    out.extend(_arrow_presets())
    return {p.name: p for p in out}


# Arrow (paper 002 §7.2-7.4) on the instance engine: 8 (or N) x Llama3-8B TP1 on A800s (the paper:
# 8 x H800), bursty Azure Code (Table 1: 3 s / 0.1 s), every request counted (whole-trace replay).
# Its metric is the sustainable rate: the highest rate whose slo_attainment is >= 90 %
# (bench/arrow_repro.py bisects for it). Rates are per instance (per GPU here); the grid is the same
# for every system (not tuned to one). ``extra`` carries the engine flags (--pools, --instances).
# The colocated 8 x TP1 run is not a pool manager: add it with ``--router dplb`` (no --pools).
ARROW_RATES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
ARROW_SYSTEMS = "arrow,static-pd,round-robin,vllm,vllm-disagg"


def _arrow_presets() -> list[Preset]:
    common = dict(rates=ARROW_RATES, deployment="llama3-8b-tp1-a800", policies=("fs",), requests=1500, warmup=0)
    out = [Preset("arrow-azure-code", "Arrow Fig. 7/8: 8 x Llama3-8B TP1 (A800), bursty Azure Code; arrow vs "
                  "static-pd 4:4 (Minimal Load), round-robin, vllm (1 x TP8 colocated), vllm-disagg (TP4 1P1D); "
                  "sustainable rate = highest with slo_attainment >= 0.9", "llama3-8b", "azure-code",
                  extra={"pools": ARROW_SYSTEMS, "instances": "8", "prefill": "sarathi"}, **common)]
    for n in (2, 4, 16):  # §7.4 (Fig. 9): 8 instances is arrow-azure-code
        out.append(Preset(f"arrow-scale-{n}", f"Arrow Fig. 9: scaling, {n} x Llama3-8B TP1 (A800), bursty Azure "
                          f"Code; arrow vs static-pd (half:half)", "llama3-8b", "azure-code",
                          extra={"pools": "arrow,static-pd", "instances": str(n), "prefill": "sarathi"}, **common))
    return out


PRESETS: dict[str, Preset] = _presets()


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"--preset: unknown {name!r} (expected one of {', '.join(PRESETS)})") from None


# -- running -------------------------------------------------------------------


def prefill_gpus(config: ServingConfig) -> int:
    """GPUs that prefill units occupy (the denominator of the per-GPU rate)."""
    from laxflow.sim.serving.plan import ModelRunner

    dep = ModelRunner(config.model, config.deployment).deployment
    gps = config.cluster.gpus_per_server or int(dep.gpus_per_node)
    units = (config.cluster.prefill_servers * gps) // int(dep.gpus)
    if units < 1:
        raise UserError(
            f"--servers: {config.cluster.servers} servers leave {config.cluster.prefill_servers * gps} prefill GPUs, "
            f"fewer than one {dep.name} unit ({dep.gpus} GPUs)"
        )
    return units * int(dep.gpus)


def build_workload(spec: RunSpec) -> list[Any]:
    """The requests of one run (identical for every policy of an experiment)."""
    from laxflow.sim import workload

    total = spec.config.warmup + spec.requests
    rate = spec.rate * prefill_gpus(spec.config)
    if spec.trace:
        reqs = workload.load_trace(spec.trace, spec.trace_format)
        reqs = sorted(reqs, key=lambda r: r.arrival)[:total]
        if spec.rate > 0:  # re-timed as Poisson at the rate: the trace's bursts are gone
            return workload.with_poisson_arrivals(reqs, rate, spec.seed)
        if spec.time_scale != 1.0:  # its own timestamps, compressed: bursts kept
            return [replace(r, arrival=r.arrival / spec.time_scale) for r in reqs]
        return reqs
    return workload.generate(spec.workload, rate, total, spec.seed, spec.prompt_scale)


def run_one(spec: RunSpec, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Simulate one run and summarize it (a top-level function: it crosses process boundaries)."""
    from laxflow.sim.serving.instances.run import check_engine_option, run_instances, uses_instances, workload_tpot_slo
    from laxflow.sim.serving.metrics import summarize
    from laxflow.sim.serving.simulator import ServingSimulator

    if uses_instances(spec.prefill, spec.router, spec.pools) or spec.instances:
        return run_instances(spec, progress)  # iteration-level engine: decode, routers, pools
    check_engine_option("--network", spec.network, engine=False)
    requests = build_workload(spec)
    config = spec.config if spec.prefill is None else replace(spec.config, prefill=spec.prefill)
    if config.tpot_slo is None:  # the workload's, where it has one
        config = replace(config, tpot_slo=workload_tpot_slo(spec.workload, spec.trace, spec.trace_format))
    result = ServingSimulator(config, requests, spec.policy, progress=progress).run()
    rate = spec.rate
    if rate == 0:  # a trace replayed at its own timestamps: report its per-GPU rate
        span = max(float(r.arrival) for r in requests) - min(float(r.arrival) for r in requests)
        rate = (len(requests) - 1) / span / prefill_gpus(spec.config) if span > 0 else 0.0
    row = summarize(result, rate)
    row["ttft_samples"] = [s.ttft for s in result.measured]
    row["slo_samples"] = [s.slo for s in result.measured]
    row["seed"] = spec.seed
    if spec.per_request:
        from laxflow.sim.serving.export import request_rows

        row["request_rows"] = request_rows(result, spec.seed, rate)
    return row


def check_policies(names: Sequence[str], flag: str = "--policies") -> None:
    """Every name loads as a flow policy, or one UserError naming ``flag`` (called before any run)."""
    from laxflow.policy.registry import policy_class

    for name in names:
        with user_errors(flag):
            policy_class(name)


def run_all(
    specs: Sequence[RunSpec],
    jobs: int = 1,
    ray_address: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_done: Callable[[RunSpec, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every spec; rows come back in ``specs`` order.

    ``jobs`` > 1 runs them in that many local processes; ``ray_address``
    (e.g. ``auto`` or ``ray://head:10001``) sends them to a Ray cluster.
    ``on_progress(n)`` counts finished requests (in-process) or runs'
    requests at once (workers); ``on_done`` is called as each run finishes.
    """
    if ray_address:
        return _run_ray(specs, ray_address, on_progress, on_done)
    rows: list[dict[str, Any] | None] = [None] * len(specs)
    if jobs <= 1 or len(specs) == 1:
        for i, spec in enumerate(specs):
            rows[i] = run_one(spec, on_progress)
            if on_done:
                on_done(spec, rows[i])
        return rows  # type: ignore[return-value]
    with ExitStack() as stack:
        # Workers report finished requests through a manager queue, so a
        # progress bar moves per request rather than per run. The manager is
        # entered first so that it outlives the pool: workers still holding
        # its queue must be gone before it shuts down.
        ticks = stack.enter_context(multiprocessing.Manager()).Queue() if on_progress else None
        pool = stack.enter_context(ProcessPoolExecutor(max_workers=min(jobs, len(specs))))
        futures = {pool.submit(_run_reporting, spec, ticks): i for i, spec in enumerate(specs)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(ticks, on_progress)
                for fut in done:
                    i = futures[fut]
                    rows[i] = fut.result()
                    if on_done:
                        on_done(specs[i], rows[i])
        except BaseException:
            # One run failed (e.g. a bad trace line): the others would fail
            # alike or no longer matter; do not start them.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        _drain(ticks, on_progress)
    return rows  # type: ignore[return-value]


def _run_reporting(spec: RunSpec, ticks: Any) -> dict[str, Any]:
    """``run_one`` in a worker process, counting finished requests into ``ticks`` (a manager queue)."""
    return run_one(spec, None if ticks is None else ticks.put)


def _drain(ticks: Any, on_progress: Callable[[int], None] | None) -> None:
    if ticks is None or on_progress is None:
        return
    n = 0
    while True:
        try:
            n += ticks.get_nowait()
        except queue.Empty:
            break
    if n:
        on_progress(n)


def _run_ray(specs, address, on_progress, on_done) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise UserError("--ray: the 'ray' package is not installed (pip install 'laxflow[ray]')") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(run_one)
    refs = [remote.remote(spec) for spec in specs]
    index = {ref: i for i, ref in enumerate(refs)}
    rows: list[dict[str, Any] | None] = [None] * len(specs)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        i = index[done[0]]
        rows[i] = ray.get(done[0])
        if on_progress:
            on_progress(specs[i].requests + specs[i].config.warmup)
        if on_done:
            on_done(specs[i], rows[i])
    return rows  # type: ignore[return-value]


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))

