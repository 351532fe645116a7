"""``laxflow sim serve`` and ``laxflow sim sweep``: policies side by side on a serving workload.

Registered on the ``laxflow sim`` app by :mod:`laxflow.sim.cli`. Flags map
onto :class:`~laxflow.sim.serving.config.ServingConfig` and
:class:`~laxflow.sim.serving.experiment.RunSpec`; a ``--preset`` fills every
flag the user did not give. Everything is validated before the first run, so
a bad flag ends in one line and exit status 2.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

import typer

from laxflow.errors import UserError

_P = "Comma-separated flow policies (registered names or module:Class)."
_H = {
    "model": "Model name (laxflow.sim.models).",
    "workload": "Synthetic workload (qwen-conv, qwen-agent, mooncake-conv, mooncake-agent).",
    "requests": "Measured requests (default 1024).",
    "warmup": "Warm-up requests left out of the metrics (512).",
    "seed": "Workload seed (0).",
    "servers": "Servers, half prefill, half decode (256).",
    "slo_scale": "SLO = this x TTFT alone on the idle cluster (3).",
    "topology": "fat-tree, big-switch or testbed.",
    "trace": "Replay a trace file instead of a synthetic workload.",
    "trace_format": "Trace format: qwen-bailian, mooncake, azure, burstgpt.",
    "preset": "demo, testbed-qwenA, testbed-qwenB, fig10-mixtral, ..., fig13 (see README).",
    "quiet": "No progress bar.",
    "kv_placement": "Where reusable KV lives: pool (the paper's: on the unit that computed it, others fetch it) "
    "or local-cache (every unit keeps a copy). Default: pool.",
}


def _with_kv_placement(config: Any, meta: dict[str, Any], placement: Optional[str]) -> tuple[Any, dict[str, Any]]:
    """``--kv-placement`` over the preset's config (validated by ServingConfig itself)."""
    if placement is not None:
        try:
            config = replace(config, kv_placement=placement)
        except UserError as exc:
            raise UserError(f"--kv-placement: {exc}".replace("kv_placement: ", "")) from None
    meta["kv_placement"] = config.kv_placement
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


def _build(preset: Optional[str], model, workload, policies, requests, warmup, seed, servers, slo_scale, topology,
           trace, trace_format) -> tuple[Any, list[str], str, int, int, dict[str, Any]]:
    """Resolve flags over a preset into (config, policies, workload, requests, seed, config-json)."""
    from laxflow.sim.serving.experiment import Preset, check_policies, get_preset

    base = get_preset(preset) if preset else Preset("", "", "mixtral-8x22b", "qwen-conv", rates=(0.7,))
    if requests is not None and requests < 1:
        raise UserError(f"--requests: expected at least 1, got {requests}")
    if warmup is not None and warmup < 0:
        raise UserError(f"--warmup: expected an integer >= 0, got {warmup}")
    if servers is not None and servers < 2:
        raise UserError(f"--servers: expected at least 2 (one prefill, one decode), got {servers}")
    if slo_scale is not None and not (math.isfinite(slo_scale) and slo_scale > 0):
        raise UserError(f"--slo-scale: expected a positive number, got {slo_scale}")
    from laxflow.sim.serving.config import TOPOLOGIES

    if topology is not None and topology not in TOPOLOGIES:
        raise UserError(f"--topology: unknown {topology!r} (expected one of {', '.join(TOPOLOGIES)})")
    if trace is not None and not trace_format:
        raise UserError("--trace-format: required with --trace")
    if trace is not None and not Path(trace).is_file():
        raise UserError(f"--trace: no such file {str(trace)!r}")
    chosen = replace(
        base,
        model=model or base.model,
        deployment=base.deployment if model is None else None,
        workload=workload or base.workload,
        requests=base.requests if requests is None else requests,
        warmup=base.warmup if warmup is None else warmup,
        seed=base.seed if seed is None else seed,
        servers=servers or base.servers,
        slo_scale=slo_scale or base.slo_scale,
        topology=topology or base.topology,
    )
    names = _split(policies, "--policies") if policies else list(chosen.policies)
    check_policies(names)
    config = chosen.config()
    config.validate()
    from laxflow.sim import models, workload as wl

    models.get_model(config.model)
    if trace is None and chosen.workload not in wl.WORKLOADS:
        raise UserError(f"--workload: unknown {chosen.workload!r} (expected one of {', '.join(wl.WORKLOADS)})")
    from laxflow.sim.serving.experiment import prefill_gpus

    gpus = prefill_gpus(config)
    meta = {
        "preset": preset,
        "model": config.model,
        "deployment": config.deployment or config.model,
        "workload": chosen.workload if trace is None else None,
        "trace": str(trace) if trace else None,
        "trace_format": trace_format,
        "requests": chosen.requests,
        "warmup": chosen.warmup,
        "seed": chosen.seed,
        "servers": config.cluster.servers,
        "topology": config.cluster.topology,
        "prefill_gpus": gpus,
        "slo_scale": config.slo_scale,
        "token_budget": config.token_budget,
        "rate_unit": "requests/s per prefill GPU",
        "policies": names,
        "preset_rates": list(chosen.rates),
    }
    return config, names, chosen.workload, chosen.requests, chosen.seed, meta


def _execute(config, names, workload, requests, seed, rates, trace, trace_format, jobs, ray_address, quiet):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from laxflow.sim.serving.experiment import RunSpec, run_all

    specs = [
        RunSpec(config, workload, rate, name, requests, seed, str(trace) if trace else None, trace_format)
        for rate in rates
        for name in names
    ]
    total = sum(s.requests + s.config.warmup for s in specs)
    with Progress(
        TextColumn("[bold]simulating[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), disable=quiet, transient=False, console=_console(),
    ) as progress:
        task = progress.add_task(f"{len(specs)} runs", total=total)
        return run_all(
            specs, jobs=jobs, ray_address=ray_address,
            on_progress=lambda n: progress.advance(task, n),
        )


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    cols = ["policy", "rate", "SLO att.", "TTFT mean", "p50", "p90", "p99", "CCT", "non-overlap", "earliness",
            "earl.>=0", "reuse GB", "coll GB", "p2d GB", "wall s"]
    console = Console()
    console.width = max(console.width, 150)  # a pipe gets 80 columns, too few for this table
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    ms = lambda x: f"{x * 1e3:.1f}ms"  # noqa: E731
    for r in rows:
        b = r["bytes_by_stage"]
        table.add_row(
            r["policy"], f"{r['rate']:g}", f"{r['slo_attainment']:.3f}", ms(r["ttft_mean"]), ms(r["ttft_p50"]),
            ms(r["ttft_p90"]), ms(r["ttft_p99"]), f"{r['cct_mean'] * 1e6:.0f}us", ms(r["nonoverlap_mean"]),
            ms(r["earliness_mean"]), ms(r["earliness_nonneg_mean"]), f"{b['reuse'] / 1e9:.1f}",
            f"{b['collective'] / 1e9:.1f}", f"{b['p2d'] / 1e9:.1f}", f"{r['wall_s']:.1f}",
        )
    console.print(table)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2, allow_nan=False)
    if str(path) == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    except OSError as exc:
        raise UserError(f"--json: cannot write {str(path)!r}: {exc.strerror}") from None


def _check_out(path: Optional[Path], flag: str) -> None:
    if path is not None and str(path) != "-" and path.exists() and path.is_dir():
        raise UserError(f"{flag}: {str(path)!r} is a directory, expected a file path")


def serve(
    model: Optional[str] = typer.Option(None, "--model", help=_H["model"]),
    workload: Optional[str] = typer.Option(None, "--workload", help=_H["workload"]),
    rate: Optional[float] = typer.Option(
        None, "--rate", help="Requests/s per prefill GPU (preset: its highest rate; a trace: its own timestamps)."
    ),
    policies: Optional[str] = typer.Option(None, "--policies", help=_P),
    requests: Optional[int] = typer.Option(None, "--requests", help=_H["requests"]),
    warmup: Optional[int] = typer.Option(None, "--warmup", help=_H["warmup"]),
    seed: Optional[int] = typer.Option(None, "--seed", help=_H["seed"]),
    servers: Optional[int] = typer.Option(None, "--servers", help=_H["servers"]),
    slo_scale: Optional[float] = typer.Option(None, "--slo-scale", help=_H["slo_scale"]),
    topology: Optional[str] = typer.Option(None, "--topology", help=_H["topology"]),
    trace: Optional[Path] = typer.Option(None, "--trace", help=_H["trace"]),
    trace_format: Optional[str] = typer.Option(None, "--trace-format", help=_H["trace_format"]),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write results as JSON to this file ('-': stdout)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: attainment per policy and TTFT CDFs."),
    preset: Optional[str] = typer.Option(None, "--preset", help=_H["preset"]),
    jobs: int = typer.Option(0, "--jobs", help="Parallel worker processes (0: one per CPU, up to 8)."),
    quiet: bool = typer.Option(False, "--quiet", help=_H["quiet"]),
    kv_placement: Optional[str] = typer.Option(None, "--kv-placement", help=_H["kv_placement"]),
) -> None:
    """Run every policy on the same workload at one rate; print a table."""
    from laxflow.sim.serving.experiment import default_jobs
    from laxflow.sim.serving.metrics import contract_view

    _check_out(json_out, "--json")
    _check_out(plot, "--plot")
    config, names, wl, n, sd, meta = _build(preset, model, workload, policies, requests, warmup, seed, servers,
                                            slo_scale, topology, trace, trace_format)
    config, meta = _with_kv_placement(config, meta, kv_placement)
    if rate is None:
        rate = 0.0 if trace is not None else meta["preset_rates"][-1]  # a trace keeps its own timestamps
    elif not (math.isfinite(rate) and rate > 0):
        raise UserError(f"--rate: expected a positive number of requests/s per prefill GPU, got {rate}")
    rows = _execute(config, names, wl, n, sd, [rate], trace, trace_format, jobs or default_jobs(), None, quiet)
    rate = rows[0]["rate"]
    meta["rate"] = rate
    _print_table(rows, f"{meta['model']} / {meta['workload'] or meta['trace']} at {rate:g} req/s/GPU "
                       f"({meta['prefill_gpus']} prefill GPUs, {n} measured requests)")
    if json_out is not None:
        _write_json(json_out, {"config": meta, "results": [contract_view(r) for r in rows]})
    if plot is not None:
        from laxflow.sim.serving.plots import plot_serve

        plot_serve(rows, meta, plot)
        typer.echo(f"plot written to {plot}", err=True)


def sweep(
    rates: Optional[str] = typer.Option(None, "--rates", help="Comma-separated requests/s per prefill GPU."),
    model: Optional[str] = typer.Option(None, "--model", help=_H["model"]),
    workload: Optional[str] = typer.Option(None, "--workload", help=_H["workload"]),
    policies: Optional[str] = typer.Option(None, "--policies", help=_P),
    requests: Optional[int] = typer.Option(None, "--requests", help=_H["requests"]),
    warmup: Optional[int] = typer.Option(None, "--warmup", help=_H["warmup"]),
    seed: Optional[int] = typer.Option(None, "--seed", help=_H["seed"]),
    servers: Optional[int] = typer.Option(None, "--servers", help=_H["servers"]),
    slo_scale: Optional[float] = typer.Option(None, "--slo-scale", help=_H["slo_scale"]),
    topology: Optional[str] = typer.Option(None, "--topology", help=_H["topology"]),
    trace: Optional[Path] = typer.Option(None, "--trace", help=_H["trace"]),
    trace_format: Optional[str] = typer.Option(None, "--trace-format", help=_H["trace_format"]),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write rows and goodput as JSON ('-': stdout)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of SLO attainment against rate."),
    preset: Optional[str] = typer.Option(None, "--preset", help=_H["preset"]),
    jobs: int = typer.Option(0, "--jobs", help="Parallel worker processes (0: one per CPU, up to 8)."),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="Run on a Ray cluster at this address (extra 'ray')."),
    quiet: bool = typer.Option(False, "--quiet", help=_H["quiet"]),
    kv_placement: Optional[str] = typer.Option(None, "--kv-placement", help=_H["kv_placement"]),
) -> None:
    """Sweep the request rate: attainment table, attainment-vs-rate plot, goodput per policy."""
    from laxflow.sim.serving.experiment import default_jobs
    from laxflow.sim.serving.metrics import contract_view, goodput

    _check_out(json_out, "--json")
    _check_out(plot, "--plot")
    config, names, wl, n, sd, meta = _build(preset, model, workload, policies, requests, warmup, seed, servers,
                                            slo_scale, topology, trace, trace_format)
    config, meta = _with_kv_placement(config, meta, kv_placement)
    rate_list = _rates(rates) if rates is not None else meta["preset_rates"]
    rows = _execute(config, names, wl, n, sd, rate_list, trace, trace_format, jobs or default_jobs(), ray_address,
                    quiet)
    meta["rates"] = rate_list
    _print_table(rows, f"{meta['model']} / {meta['workload'] or meta['trace']} sweep "
                       f"({meta['prefill_gpus']} prefill GPUs, {n} measured requests)")
    good = goodput(rows)
    from rich.console import Console

    Console().print("goodput (largest swept rate with >= 90% SLO attainment, req/s/GPU): "
                    + ", ".join(f"{p} {'-' if g is None else f'{g:g}'}" for p, g in good.items()))
    if json_out is not None:
        _write_json(json_out, {"config": meta, "results": [contract_view(r) for r in rows], "goodput": good})
    if plot is not None:
        from laxflow.sim.serving.plots import plot_sweep

        plot_sweep(rows, meta, plot)
        typer.echo(f"plot written to {plot}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``sweep`` to the ``laxflow sim`` app."""
    app.command("serve")(serve)
    app.command("sweep")(sweep)
