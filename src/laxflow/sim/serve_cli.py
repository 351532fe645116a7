"""``laxflow sim serve`` and ``laxflow sim sweep``: policies side by side on a serving workload.

Registered on the ``laxflow sim`` app by :mod:`laxflow.sim.cli`; their flags
are defined once in :mod:`laxflow.sim.serve_options`. Flags map onto
:class:`~laxflow.sim.serving.config.ServingConfig` and
:class:`~laxflow.sim.serving.experiment.RunSpec`; a ``--preset`` fills every
flag the user did not give. Everything is validated before the first run, so
a bad flag ends in one line and exit status 2.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, TextIO

import typer

from laxflow.errors import UserError
from laxflow.sim import serve_options

MAX_SEEDS = 1000


def _with_kv_placement(config: Any, meta: dict[str, Any], placement: Optional[str]) -> tuple[Any, dict[str, Any]]:
    """``--kv-placement`` over the preset's config (validated by ServingConfig itself)."""
    if placement is not None:
        try:
            config = replace(config, kv_placement=placement)
        except UserError as exc:
            raise UserError(f"--kv-placement: {exc}".replace("kv_placement: ", "")) from None
    meta["kv_placement"] = config.kv_placement
    return config, meta


def _with_physics(config: Any, meta: dict[str, Any], v: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``--physics`` then ``--ep-comm``, ``--fairness``, ``--comm-share``, ``--reuse-from`` over the config
    (each validated by ServingConfig / ClusterConfig, the error reworded to name the flag)."""
    flag = "--physics"
    try:
        if v.get("physics") is not None:
            config = config.with_physics(v["physics"])
        for name in ("ep_comm", "comm_share", "reuse_from"):
            if v.get(name) is not None:
                flag = "--" + name.replace("_", "-")
                config = replace(config, **{name: v[name]})
        if v.get("fairness") is not None:
            flag = "--fairness"
            config = replace(config, cluster=replace(config.cluster, fairness=v["fairness"]))
    except UserError as exc:
        text = str(exc)
        for prefix in ("physics: ", "ep_comm: ", "comm_share: ", "reuse_from: ", "cluster.fairness: "):
            text = text.replace(prefix, "")
        raise UserError(f"{flag}: {text}") from None
    meta.update(physics=config.physics, ep_comm=config.ep_comm, fairness=config.cluster.fairness,
                comm_share=config.comm_share, reuse_from=config.reuse_from)
    return config, meta


def _split(value: str, flag: str) -> list[str]:
    names = [p.strip() for p in value.split(",") if p.strip()]
    if not names:
        raise UserError(f"{flag}: expected at least one comma-separated name")
    return names


def _rates(value: str) -> list[float]:
    try:
        rates = [float(x) for x in _split(value, "--rates")]
    except ValueError:
        raise UserError(f"--rates: expected comma-separated numbers, got {value!r}") from None
    for r in rates:
        if not (math.isfinite(r) and r > 0):
            raise UserError(f"--rates: every rate must be a positive number of requests/s per GPU, got {r!r}")
    return rates


def _seeds(value: Optional[str], first: int) -> list[int]:
    """``--seeds N`` (N seeds from ``first``) or ``--seeds 3,5,8``."""
    if value is None:
        return [first]
    text = value.strip()
    try:
        if "," not in text:
            n = int(text)
            if not 1 <= n <= MAX_SEEDS:
                raise UserError(f"--seeds: expected a number of seeds from 1 to {MAX_SEEDS}, got {n}")
            return list(range(first, first + n))
        seeds = [int(x) for x in _split(text, "--seeds")]
    except ValueError:
        raise UserError(f"--seeds: expected a number of seeds or comma-separated integer seeds, got {value!r}") \
            from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds) or len(seeds) > MAX_SEEDS:
        raise UserError(f"--seeds: expected up to {MAX_SEEDS} distinct seeds >= 0, got {value!r}")
    return seeds


def _check_plot(path: Path) -> None:
    """The plot's extension must be one matplotlib writes (checked before any run, not after)."""
    from matplotlib.backend_bases import FigureCanvasBase

    types = sorted(FigureCanvasBase.get_supported_filetypes())
    if path.suffix.lower().lstrip(".") not in types:
        raise UserError(f"--plot: {str(path)!r}: expected a file name ending in one of "
                        f"{', '.join('.' + t for t in types)}")


def _prepare_out(path: Optional[Path], flag: str) -> None:
    """An output path is a file path; a missing directory is created, and said so (before any run)."""
    if path is None or str(path) == "-":
        return
    if path.is_dir():
        raise UserError(f"{flag}: {str(path)!r} is a directory, expected a file path")
    parent = path.parent
    if not parent.exists():
        try:
            parent.mkdir(parents=True)
        except OSError as exc:
            raise UserError(f"{flag}: cannot create directory {str(parent)!r}: {exc.strerror}") from None
        print(f"laxflow: created directory {str(parent)!r} for {flag}", file=sys.stderr)
    elif not parent.is_dir():
        raise UserError(f"{flag}: {str(parent)!r} is not a directory")


@dataclass
class Plan:
    """Everything one serve or sweep will run, resolved and validated."""

    config: Any  # ServingConfig
    policies: list[str]
    workload: str
    requests: int
    seeds: list[int]
    meta: dict[str, Any]
    prefills: list[Any] = field(default_factory=lambda: [None])  # --prefill names, or [None] (the units' FCFS batches)
    routers: list[Any] = field(default_factory=lambda: [None])  # --router names (instance engine)
    pools: list[Any] = field(default_factory=lambda: [None])  # --pools names (instance engine)
    instances: Optional[str] = None  # --instances (instance engine)
    network: str = "fabric"  # --network (instance engine: fabric or ideal)
    p2d: str = "prompt"  # --p2d (instance engine: prompt or layer)
    placement: str = "ports"  # --placement (instance engine: ports or cluster)


def _trace_count(v: dict[str, Any], warmup: int) -> int:
    """Requests in the trace (loaded once here, so a bad file fails before any worker starts)."""
    from laxflow.sim.workload import load_trace

    n = len(load_trace(v["trace"], v["trace_format"]))
    want = (v["requests"] if v["requests"] is not None else 0) + warmup
    if n <= warmup:
        raise UserError(f"--warmup: {warmup} warm-up requests leave none of the trace's {n} to measure")
    if v["requests"] is not None and want > n:
        print(f"laxflow: warning: the trace has {n} requests, fewer than --requests {v['requests']} + --warmup "
              f"{warmup}; measuring its last {n - warmup}", file=sys.stderr)
    return n


def _build(v: dict[str, Any], which: str) -> Plan:
    """Resolve flags over a preset into a :class:`Plan`; every check that can fail runs here."""
    from laxflow.sim.serving.config import TOPOLOGIES
    from laxflow.sim.serving.experiment import (CAPACITY, ENGINE_PRESET_KEYS, MAX_REQUESTS, Preset, check_policies,
                                                get_preset, prefill_gpus, rates_at)

    preset = v["preset"]
    base = get_preset(preset) if preset else Preset("", "", "mixtral-8x22b", "qwen-conv", rates=(0.7,))

    # An instance-engine preset's --prefill/--router/--pools/--instances, unless given on the line.
    v = {**v, **{k: base.extra[k] for k in ENGINE_PRESET_KEYS if k in base.extra and v.get(k) is None}}
    requests, warmup = v["requests"], v["warmup"]
    if requests is not None and not 1 <= requests <= MAX_REQUESTS:
        raise UserError(f"--requests: expected 1 to {MAX_REQUESTS:,} (a run holds every request in memory), "
                        f"got {requests}")
    if warmup is not None and not 0 <= warmup <= MAX_REQUESTS:
        raise UserError(f"--warmup: expected an integer from 0 to {MAX_REQUESTS:,}, got {warmup}")
    if v["servers"] is not None and v["servers"] < 2:
        raise UserError(f"--servers: expected at least 2 (one prefill, one decode), got {v['servers']}")
    if v["slo_scale"] is not None and not (math.isfinite(v["slo_scale"]) and v["slo_scale"] > 0):
        raise UserError(f"--slo-scale: expected a positive number, got {v['slo_scale']}")
    if v["jobs"] < 0:
        raise UserError(f"--jobs: expected 0 (one per CPU) or a positive number of processes, got {v['jobs']}")
    if v.get("tpot_slo") is not None and not (math.isfinite(v["tpot_slo"]) and v["tpot_slo"] > 0):
        raise UserError(f"--tpot-slo: expected a positive number of seconds, got {v['tpot_slo']}")
    if v.get("nic_gbps") is not None and not (math.isfinite(v["nic_gbps"]) and v["nic_gbps"] > 0):
        raise UserError(f"--nic-gbps: expected a positive number of Gbit/s, got {v['nic_gbps']}")
    if v["topology"] is not None and v["topology"] not in TOPOLOGIES:
        raise UserError(f"--topology: unknown {v['topology']!r} (expected one of {', '.join(TOPOLOGIES)})")
    trace = v["trace"]
    if trace is None:
        if v["trace_format"] is not None:
            raise UserError("--trace-format: only with --trace FILE")
        if v.get("time_scale") is not None:
            raise UserError("--time-scale: only with --trace FILE (a synthetic workload has no timestamps)")
    else:
        if v["workload"] is not None:
            raise UserError("--workload: not with --trace (the trace is the workload)")
        if not v["trace_format"]:
            raise UserError("--trace-format: required with --trace")
        if trace.is_dir():
            raise UserError(f"--trace: {str(trace)!r} is a directory, expected a trace file")
        if not trace.is_file():
            raise UserError(f"--trace: no such file {str(trace)!r}")
    if v.get("time_scale") is not None:
        if not (math.isfinite(v["time_scale"]) and v["time_scale"] > 0):
            raise UserError(f"--time-scale: expected a positive number, got {v['time_scale']}")
        if v.get("rate") is not None:
            raise UserError("--time-scale: not with --rate (--rate re-times the trace as Poisson arrivals)")
    if v["plot"] is not None:
        _check_plot(v["plot"])
    if v["requests_out"] is not None:
        from laxflow.sim.serving.export import check_requests_path

        check_requests_path(v["requests_out"])
    chosen = replace(
        base,
        model=v["model"] or base.model,
        deployment=base.deployment if v["model"] is None else None,
        workload=v["workload"] or base.workload,
        requests=base.requests if requests is None else requests,
        warmup=base.warmup if warmup is None else warmup,
        seed=base.seed if v["seed"] is None else v["seed"],
        servers=v["servers"] or base.servers,
        slo_scale=v["slo_scale"] or base.slo_scale,
        topology=v["topology"] or base.topology,
    )
    if chosen.requests + chosen.warmup > MAX_REQUESTS:
        raise UserError(f"--requests: {chosen.requests:,} measured + {chosen.warmup:,} warm-up requests exceed "
                        f"the limit of {MAX_REQUESTS:,} per run")
    if v["seed"] is not None and v["seed"] < 0:
        raise UserError(f"--seed: expected an integer >= 0, got {v['seed']}")
    seeds = _seeds(v["seeds"], chosen.seed)
    prefills, routers, pools, engine = _engine_choices(v)
    from laxflow.integrations.prefill.registry import prefill_scheduler_names
    from laxflow.sim.serving.instances.run import check_engine_option

    # Prefill units (a prefill scheduler) on the instance engine keep the unit engine's layout by default.
    units = engine and prefills[0] in prefill_scheduler_names()
    batched = engine and not units
    layout = {"network": v.get("network") or "fabric", "p2d": v.get("p2d") or ("prompt" if batched else "layer"),
              "placement": v.get("placement") or ("ports" if batched else "cluster")}
    for name, value in layout.items():
        check_engine_option("--" + name, value, engine)
    if units:
        from laxflow.sim.serving.instances.config import check_prefill_units

        check_prefill_units(prefills[0], ":" in (v.get("instances") or ""), None if pools == [None] else pools[0],
                            layout["placement"], layout["p2d"])
    names = _split(v["policies"], "--policies") if v["policies"] else list(chosen.policies)
    if engine and not v["policies"] and not preset:
        names = ["fs"]  # the flow policy only orders P2D flows there: one is enough unless asked
    check_policies(names)
    if engine and v["workload"] is None and trace is None and not preset:
        chosen = replace(chosen, workload="qwen-trace")  # the MFS default workload has no TPOT SLO
    config = chosen.config()
    if v.get("dispatch") is not None:
        if v["dispatch"] not in ("load", "ttft"):
            raise UserError(f"--dispatch: expected load or ttft, got {v['dispatch']!r}")
        config = replace(config, router_dispatch=v["dispatch"])
    if v.get("decode") is not None:
        from laxflow.sim.serving.config import DECODES

        if v["decode"] not in DECODES:
            raise UserError(f"--decode: expected one of {', '.join(DECODES)}, got {v['decode']!r}")
        if engine:
            raise UserError("--decode: only for the MFS prefill units; the instance engine (--prefill BATCH_SCHEDULER, "
                            "--router, --pools or --instances) always runs decode steps")
        config = replace(config, decode=v["decode"])
    if v.get("nic_gbps") is not None:
        config = replace(config, cluster=replace(config.cluster, nic_gbps=float(v["nic_gbps"])))
    if v.get("tpot_slo") is not None:
        config = replace(config, tpot_slo=float(v["tpot_slo"]))
    config.validate()
    from laxflow.sim import models, workload as wl

    models.get_model(config.model)
    known = [*wl.WORKLOADS, "qwen-multislo", *wl.SLO_WORKLOADS]
    if trace is None and chosen.workload not in known:
        raise UserError(f"--workload: unknown {chosen.workload!r} (expected one of {', '.join(known)})")
    if engine:
        config = _engine_config(config, v, chosen.workload, trace)
        gpus = _engine_gpus(config, v["instances"])
    else:
        gpus = prefill_gpus(config)
    meta = {
        "preset": preset,
        "model": config.model,
        "deployment": config.deployment or config.model,
        "workload": chosen.workload if trace is None else None,
        "trace": str(trace) if trace else None,
        "trace_format": v["trace_format"],
        "requests": chosen.requests,
        "warmup": chosen.warmup,
        "seed": seeds[0],
        "seeds": seeds,
        "servers": config.cluster.servers,
        "topology": config.cluster.topology,
        "nic_gbps": config.cluster.nic_gbps,  # None: the deployment's
        "prefill_gpus": gpus,
        "slo_scale": config.slo_scale,
        "tpot_slo": config.tpot_slo,  # None: the workload's
        "token_budget": config.token_budget,
        "rate_unit": "requests/s per instance" if engine else "requests/s per prefill GPU",
        "policies": names,
        "prefill": None if prefills == [None] else prefills,
        "router": None if routers == [None] else routers,
        "pools": None if pools == [None] else pools,
        "instances": (v["instances"] or "1") if engine else None,
        "dispatch": config.router_dispatch,
        "decode": "steps" if engine else config.decode,
        **layout,
        "preset_rates": list(chosen.rates),
    }
    config, meta = _with_kv_placement(config, meta, v["kv_placement"])
    config, meta = _with_physics(config, meta, v)
    if engine and config.physics != "faithful":
        raise UserError("--physics and its flags: only for the MFS unit-level engine, not with --prefill/--router/"
                        "--pools/--instances of the instance engine")
    pair = (config.model, chosen.workload)
    if (preset and config.physics != "faithful" and pair in CAPACITY
            and tuple(chosen.rates) == rates_at(*pair)):
        # A figure preset sweeps fractions of capacity: keep the fractions, under this physics' capacity.
        meta["preset_rates"] = list(rates_at(*pair, physics=config.physics))
    if trace is not None:
        meta["trace_requests"] = _trace_count(v, chosen.warmup)
        meta["time_scale"] = v.get("time_scale")
    for flag, name in (("--json", "json_out"), ("--plot", "plot"), ("--requests-out", "requests_out")):
        _prepare_out(v[name], flag)
    return Plan(config, names, chosen.workload, chosen.requests, seeds, meta, prefills, routers, pools,
                v["instances"] if engine else None, **layout)


def _engine_choices(v: dict[str, Any]) -> tuple[list[Any], list[Any], list[Any], bool]:
    """--prefill, --router, --pools as lists, and whether they select the iteration-level instance engine."""
    from laxflow.integrations.prefill.registry import batch_scheduler_names, prefill_scheduler_names

    unit, batch = prefill_scheduler_names(), batch_scheduler_names()
    prefills: list[Any] = _split(v["prefill"], "--prefill") if v.get("prefill") else [None]
    for p in prefills:
        if p is not None and p not in unit and p not in batch:
            raise UserError(f"--prefill: unknown {p!r} (expected one of {', '.join(unit + batch)})")
    routers: list[Any] = _split(v["router"], "--router") if v.get("router") else [None]
    if routers != [None]:
        from laxflow.integrations.routing.registry import router_names

        for r in routers:
            if r not in router_names():
                raise UserError(f"--router: unknown {r!r} (expected one of {', '.join(router_names())})")
    pools: list[Any] = _split(v["pools"], "--pools") if v.get("pools") else [None]
    if pools != [None]:
        from laxflow.integrations.pools.registry import pool_manager_names

        for m in pools:
            if m not in pool_manager_names():
                raise UserError(f"--pools: unknown {m!r} (expected one of {', '.join(pool_manager_names())})")
    engine = any(p in batch for p in prefills) or routers != [None] or pools != [None] or bool(v.get("instances"))
    if engine:
        if any(p in unit for p in prefills) and not all(p in unit for p in prefills):
            raise UserError(f"--prefill {','.join(p or 'sarathi' for p in prefills)}: give prefill schedulers (prefill "
                            f"units: {', '.join(unit)}) or batch schedulers ({', '.join(batch)}), not both in one run")
        prefills = ["sarathi"] if prefills == [None] else prefills
        if routers != [None] and pools != [None]:
            raise UserError(f"--router {','.join(routers)} with --pools {','.join(pools)}: a pool manager "
                            f"dispatches its own requests; give one of them")
        # Default router only without pools (a pool run's router is its pool manager: run.py labels it).
        routers = ["dplb"] if routers == [None] and pools == [None] else routers
    return prefills, routers, pools, engine


def _engine_config(config: Any, v: dict[str, Any], workload: str, trace: Optional[Path]) -> Any:
    """The ServingConfig of an instance-engine run: its deployment (one instance = one replica)."""
    from laxflow.sim.models import get_deployment
    from laxflow.sim.serving.instances.config import DEFAULT_DEPLOYMENT
    from laxflow.sim.serving.instances.run import slo_workload_name

    slo_workload_name(workload, str(trace) if trace else None, v["trace_format"])
    name = config.deployment or (config.model if v["model"] or v["preset"] else DEFAULT_DEPLOYMENT)
    dep = get_deployment(name)
    return replace(config, model=dep.model, deployment=dep.name)


def _engine_gpus(config: Any, instances: Optional[str]) -> int:
    from laxflow.sim.models import get_deployment
    from laxflow.sim.serving.instances.config import parse_instances

    total, _ = parse_instances(instances or "1")
    return total * int(get_deployment(config.deployment).gpus)


def _execute(plan: Plan, rates: list[float], v: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Run every (rate, policy, seed); returns the specs and their rows in the same order."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from laxflow.sim.serving.experiment import RunSpec, default_jobs, run_all

    trace = str(v["trace"]) if v["trace"] else None
    specs = [
        RunSpec(plan.config, plan.workload, rate, name, plan.requests, seed, trace, v["trace_format"],
                time_scale=v.get("time_scale") or 1.0, per_request=v["requests_out"] is not None, prefill=prefill,
                router=router, pools=pools, instances=plan.instances, network=plan.network, p2d=plan.p2d,
                placement=plan.placement)
        for rate in rates
        for prefill in plan.prefills
        for router in plan.routers
        for pools in plan.pools
        for name in plan.policies
        for seed in plan.seeds
    ]
    if trace is not None and len(plan.seeds) > 1 and 0.0 in rates:
        print("laxflow: warning: a trace replayed at its own timestamps is the same for every seed; "
              "the seeds' runs are identical (give --rate to re-time it per seed)", file=sys.stderr)
    cap = plan.meta.get("trace_requests", math.inf)  # a trace may hold fewer than asked for
    total = sum(min(s.requests + s.config.warmup, cap) for s in specs)
    from rich.console import Console

    with Progress(
        TextColumn("[bold]simulating[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), disable=v["quiet"], transient=False,
        console=Console(stderr=True),
    ) as progress:
        task = progress.add_task(f"{len(specs)} runs", total=total)
        rows = run_all(specs, jobs=v["jobs"] or default_jobs(), ray_address=v.get("ray_address"),
                       on_progress=lambda n: progress.advance(task, n))
    return specs, rows


def _report(plan: Plan, specs: list[Any], rows: list[dict[str, Any]], v: dict[str, Any], title: str,
            extra: Optional[dict[str, Any]] = None) -> tuple[list[dict[str, Any]], TextIO]:
    """Points over seeds, the table, --json and --requests-out; returns the points and the table's stream."""
    from laxflow.sim.serving import report

    pts = report.points(rows, [(s.rate, s.label) for s in specs])
    measured = pts[0]["requests"]
    plan.meta["requested"] = plan.meta["requests"]
    plan.meta["requests"] = measured  # what was measured, as the title and every result say
    seeds = len(plan.seeds)
    stream = sys.stderr if v["json_out"] is not None and str(v["json_out"]) == "-" else sys.stdout
    where = (f"{plan.meta['instances']} instances of {plan.meta['deployment']}" if plan.meta.get("instances")
             else f"{plan.meta['prefill_gpus']} prefill GPUs on {plan.meta['servers']} servers")
    report.print_table(pts, f"{title} ({where}, {measured} measured requests, {seeds} seed{'s' if seeds > 1 else ''})",
                       stream)
    if v["requests_out"] is not None:
        from laxflow.sim.serving.export import write_requests

        write_requests(v["requests_out"], [r for p in pts for r in p["request_rows"]])
        print(f"laxflow: {sum(len(p['request_rows']) for p in pts)} request rows written to "
              f"{str(v['requests_out'])!r}", file=sys.stderr)
    if v["json_out"] is not None:
        _write_json(v["json_out"], {"config": plan.meta, "results": [report.json_view(p) for p in pts],
                                    **(extra or {})})
    return pts, stream


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2, allow_nan=False)
    if str(path) == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    try:
        path.write_text(text + "\n")
    except OSError as exc:
        raise UserError(f"--json: cannot write {str(path)!r}: {exc.strerror}") from None


def _serve(v: dict[str, Any]) -> None:
    plan = _build(v, "serve")
    rate = v["rate"]
    if rate is None:
        rate = 0.0 if v["trace"] is not None else plan.meta["preset_rates"][-1]  # a trace keeps its own timestamps
    elif not (math.isfinite(rate) and rate > 0):
        raise UserError(f"--rate: expected a positive number of requests/s per prefill GPU, got {rate}")
    specs, rows = _execute(plan, [rate], v)
    rate = rows[0]["rate"]
    plan.meta["rate"] = rate
    what = plan.meta["workload"] or plan.meta["trace"]
    unit = "req/s/instance" if plan.meta.get("instances") else "req/s/GPU"
    pts, _ = _report(plan, specs, rows, v, f"{plan.meta['model']} / {what} at {rate:g} {unit}")
    if v["plot"] is not None:
        from laxflow.sim.serving.plots import plot_serve

        plot_serve(pts, plan.meta, v["plot"])
        print(f"laxflow: plot written to {str(v['plot'])!r}", file=sys.stderr)


def _sweep(v: dict[str, Any]) -> None:
    from laxflow.sim.serving.report import goodput_over_seeds

    plan = _build(v, "sweep")
    rate_list = _rates(v["rates"]) if v["rates"] is not None else plan.meta["preset_rates"]
    plan.meta["rates"] = rate_list
    specs, rows = _execute(plan, rate_list, v)
    good = goodput_over_seeds(rows)
    pts, stream = _report(plan, specs, rows, v, f"{plan.meta['model']} / {plan.meta['workload'] or plan.meta['trace']}"
                          " sweep", extra=good)
    cells = []
    for p, g in good["goodput"].items():
        ci = good["goodput_ci95"][p]
        cell = f"{p} {'-' if g is None else f'{g:g}'}" + ("" if ci is None else f" ± {ci:.2g}")
        per_seed = good["goodput_seeds"][p]
        if g is None and len(per_seed) > 1 and any(x is not None for x in per_seed):
            cell += " (per seed: " + " ".join("-" if x is None else f"{x:g}" for x in per_seed) + ")"
        cells.append(cell)
    print("goodput (largest swept rate with >= 90% SLO attainment, req/s/GPU"
          + (", mean ± 95% CI over seeds" if len(plan.seeds) > 1 else "") + "): " + ", ".join(cells), file=stream)
    if v["plot"] is not None:
        from laxflow.sim.serving.plots import plot_sweep

        plot_sweep(pts, plan.meta, v["plot"])
        print(f"laxflow: plot written to {str(v['plot'])!r}", file=sys.stderr)


serve = serve_options.command(_serve, "serve", "Run every policy on the same workload at one rate; print a table.")
sweep = serve_options.command(_sweep, "sweep", "Sweep the request rate: attainment table, attainment-vs-rate "
                                               "plot, goodput per policy.")


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``sweep`` to the ``laxflow sim`` app."""
    app.command("serve")(serve)
    app.command("sweep")(sweep)
