"""One ``RunSpec`` on the iteration-level engine: workload, SLOs, instances, metrics row.

Called by ``experiment.run_one`` (in a worker process or in-process) when the
spec names an iteration-level batch scheduler (``--prefill fairbatching``...),
a router (``--router``) or a pool manager (``--pools``). Rate: requests/s per
instance (all instances, prefill and decode alike).

Pool managers: ``--pools NAME`` loads ``laxflow.sim.serving.instances.pools``
(``create_pool_dispatcher(name, engine_config, samples) -> Dispatcher``) when a
build provides it; the engine then dispatches through it (see ``engine``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from laxflow.errors import UserError
from laxflow.sim.serving.instances.config import (DEFAULT_DEPLOYMENT, NETWORKS, P2D_MODES, PLACEMENTS,
                                                  InstanceSimConfig, parse_instances)
from laxflow.sim.workload.slo_traces import SLO_WORKLOADS, TRACE_FORMAT_SLO, with_priorities


def uses_instances(prefill: str | None, router: str | None, pools: str | None) -> bool:
    """Whether a run goes to the iteration-level engine (a batch scheduler, a router or pools)."""
    from laxflow.integrations.prefill.registry import batch_scheduler_names

    return (prefill in batch_scheduler_names()) or router is not None or pools is not None


# The instance engine's layout flags: flag -> (its choices, the MFS prefill units' own way, what the flag chooses,
# how the prefill units do it). The prefill units take the flag only at their own value.
ENGINE_OPTIONS = {
    "--network": (NETWORKS, "fabric", "a network choice", "always run the fabric"),
    "--p2d": (P2D_MODES, "layer", "a P2D choice", "send each layer's KV as it is computed"),
    "--placement": (PLACEMENTS, "cluster", "a placement choice", "sit on the cluster's servers"),
}


def check_engine_option(flag: str, value: str, engine: bool) -> None:
    """``value`` of ``flag`` (one of ENGINE_OPTIONS) is known, and the prefill units' own unless ``engine``."""
    choices, unit_own, what, how = ENGINE_OPTIONS[flag]
    if value not in choices:
        raise UserError(f"{flag}: unknown {value!r} (expected one of {', '.join(choices)})")
    if value != unit_own and not engine:
        raise UserError(f"{flag} {value}: only the instance engine (--prefill BATCH_SCHEDULER, --router, --pools or "
                        f"--instances) has {what}; the MFS prefill units {how}")


def _slo_source(workload: str, trace: str | None, trace_format: str | None) -> str | None:
    """The workload whose SLOs a run takes: the workload, or a trace's format's source."""
    return TRACE_FORMAT_SLO.get(trace_format or "") if trace else workload


def workload_tpot_slo(workload: str, trace: str | None, trace_format: str | None) -> float | None:
    """The TPOT SLO of a run's workload (or its trace format's source), None where it has none."""
    name = _slo_source(workload, trace, trace_format)
    return SLO_WORKLOADS[name].tpot_slo if name in SLO_WORKLOADS else None


def slo_workload_name(workload: str, trace: str | None, trace_format: str | None) -> str:
    """The SLO_WORKLOADS entry whose SLO a run uses (the workload, or the trace format's source)."""
    name = _slo_source(workload, trace, trace_format)
    if name not in SLO_WORKLOADS:
        raise UserError(f"--workload: {workload!r} has no TPOT SLO for the iteration-level engine "
                        f"(expected one of {', '.join(SLO_WORKLOADS)}, or a --trace)")
    return name


def engine_config(spec: Any) -> InstanceSimConfig:
    """The engine's config for ``spec`` (an ``experiment.RunSpec``)."""
    total, prefill = parse_instances(spec.instances or "1")
    if spec.pools is not None and spec.router is not None:
        raise UserError(f"--router {spec.router} with --pools {spec.pools}: the pool manager dispatches; "
                        f"give one of them")
    w = SLO_WORKLOADS[slo_workload_name(spec.workload, spec.trace, spec.trace_format)]
    return InstanceSimConfig(
        deployment=spec.config.deployment or DEFAULT_DEPLOYMENT, instances=total, prefill_instances=prefill,
        scheduler=spec.prefill or "sarathi", router=spec.router or "dplb", pools=spec.pools,
        ttft_slo=w.ttft_slo, tpot_slo=spec.config.tpot_slo or w.tpot_slo, warmup=spec.config.warmup, seed=spec.seed, flow_policy=spec.policy,
        network=spec.network, cluster=spec.config.cluster, p2d=spec.p2d, placement=spec.placement)


def _pool_dispatcher(config: InstanceSimConfig) -> Any:
    if config.pools is None:
        return None
    try:
        from laxflow.sim.serving.instances import pools  # type: ignore[attr-defined]
    except ImportError:
        raise UserError(f"--pools {config.pools}: this build's simulator has no pool-manager integration") from None
    from laxflow.sim.serving.instances.profile import profile_samples

    return pools.create_pool_dispatcher(config.pools, config, profile_samples(config.deployment))


def run_instances(spec: Any, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Simulate ``spec`` on the instance engine; the metrics row (keys as ``metrics.summarize``)."""
    from laxflow.sim import workload
    from laxflow.sim.serving.instances.engine import InstanceEngine
    from laxflow.sim.serving.metrics import request_metrics, summarize

    config = engine_config(spec)
    total = spec.config.warmup + spec.requests
    units = config.instances  # --instances: the rate is per one of these, whatever shape the pools give them
    rate = spec.rate * units
    if config.pools is not None:
        from laxflow.sim.serving.instances.pools import reshape_config

        config = reshape_config(config)  # the vLLM baselines: the same GPUs as fewer, wider instances
    if spec.trace:
        reqs = sorted(workload.load_trace(spec.trace, spec.trace_format), key=lambda r: r.arrival)[:total]
        if spec.rate > 0:
            reqs = workload.with_poisson_arrivals(reqs, rate, spec.seed)
        elif spec.time_scale != 1.0:
            reqs = [replace(r, arrival=r.arrival / spec.time_scale) for r in reqs]
        if SLO_WORKLOADS[slo_workload_name(spec.workload, spec.trace, spec.trace_format)].priorities:
            reqs = with_priorities(reqs, spec.seed)
    else:
        reqs = workload.generate(spec.workload, rate, total, spec.seed)
    engine = InstanceEngine(config, reqs, dispatcher=_pool_dispatcher(config), progress=progress)
    result = engine.run()
    if spec.rate == 0:
        span = max(r.arrival for r in reqs) - min(r.arrival for r in reqs)
        rate_out = (len(reqs) - 1) / span / units if span > 0 else 0.0
    else:
        rate_out = spec.rate
    # With --pools the pool manager dispatches (no router runs): it is the row's router too.
    label = {"policy": spec.policy, "prefill": config.scheduler, "router": config.pools or config.router,
             "pools": config.pools, "instances": spec.instances or "1"}
    row = summarize(result, rate_out, label, engine=engine)  # the engine: its network bytes, pruned set, flips
    served = [s for s in result.measured if not s.rejected]  # admission control's rejects have no TTFT
    row["ttft_samples"] = [request_metrics(s)["ttft"] for s in served]
    row["slo_samples"] = [s.ttft_slo for s in served]
    row["seed"] = spec.seed
    if spec.per_request:
        unit = {iid: k for k, iid in enumerate(engine.instances)}  # instance id -> its unit number
        row["request_rows"] = [_request_row(s, spec, rate_out, engine, unit) for s in served]
    return row


def _request_row(s: Any, spec: Any, rate: float, engine: Any, unit: dict[Any, int]) -> dict[str, Any]:
    """``--requests-out``: the serving export's columns (no reuse, batch or stall here)."""
    from laxflow.sim.serving.export import decode_columns
    from laxflow.sim.serving.metrics import met_slo, request_metrics

    m = request_metrics(s)
    moved = s.decode_instance is not None and s.decode_instance != s.prefill_instance
    return {"policy": spec.label, "rate": rate, "seed": spec.seed, "id": s.id, "arrival": s.arrival,
            "prompt_tokens": s.prompt, "reused_tokens": 0, "remote_tokens": 0, "unit": unit[s.prefill_instance],
            "decode_unit": unit[s.decode_instance or s.prefill_instance], "batch": "", "slo": s.ttft_slo,
            "ttft": m["ttft"], "met": met_slo(m["ttft"], s.ttft_slo),
            "bytes_reuse": 0.0, "bytes_collective": 0.0,
            "bytes_p2d": float(s.prompt_tokens * engine.timer.kv_bytes_per_token()) if moved else 0.0,
            "stall": 0.0, **decode_columns(s, m)}
