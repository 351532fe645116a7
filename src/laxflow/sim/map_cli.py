"""``laxflow sim map``: where MFS pays, across the parameters that decide contention.

Registered on the ``laxflow sim`` app by :mod:`laxflow.sim.cli`. Every flag
(and every ``--config`` key) is resolved and checked here before anything is
simulated, so a bad value ends in one line and exit status 2; the grid is
:mod:`laxflow.sim.map.grid`, the runs :mod:`laxflow.sim.map.run`, the files
:mod:`laxflow.sim.map.output`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from laxflow.errors import UserError
from laxflow.sim.map.grid import AXES, GRIDS

AX = {a.name: a for a in AXES}

DEFAULT_MODELS = "mixtral-8x22b,dbrx"
DEFAULT_POLICIES = "fs,sjf,edf,karuna,mfs"
MAX_SEEDS = 1000

# Flags that are not axes: name -> (flag, default, help). The axes' flags come from grid.AXES.
OTHER = {
    "models": ("--models", DEFAULT_MODELS, "Comma-separated models, each on its paper deployment (laxflow sim list "
               "models); with --config (a cluster table) the default is the user's row alone."),
    "workload": ("--workload", None, "Calibrated workload of every row (default: each model's presets': "
                 "qwen-conv, mooncake-conv for llama3-8b)."),
    "grid": ("--grid", "star", "star: the base point and one axis at a time around it; product: every combination."),
    "base_load": ("--base-load", 0.8, "Load of the base point (fraction of capacity)."),
    "policies": ("--policies", DEFAULT_POLICIES, "Comma-separated flow policies: mfs and at least one baseline "
                 "(fs, sjf, edf, karuna)."),
    "seeds": ("--seeds", 3, "Seeds per cell (0 .. N-1 from --seed); every policy runs the same requests per seed."),
    "seed": ("--seed", 0, "First seed."),
    "requests": ("--requests", 200, "Measured requests per run."),
    "warmup": ("--warmup", 100, "Warm-up requests per run, left out of the metrics."),
    "servers": ("--servers", 16, "Servers of each catalog row, half prefill, half decode."),
    "topology": ("--topology", "fat-tree", "Fabric of each catalog row: fat-tree, big-switch or testbed."),
    "slo_scale": ("--slo-scale", 3.0, "SLO = this x TTFT alone on the idle cluster."),
    "physics": ("--physics", "faithful", "faithful, paper, or field=value;... (as laxflow sim serve --physics): "
                "every cell's fairness, compute share and reuse, and its capacity under them; the MoE exchange "
                "stays the --ep-comm axis (give pairwise there for the paper's)."),
}
OUTPUTS = {
    "json_out": ("--json", "Write the cells (parameters and figures) to this file; a rerun with the same file "
                 "skips the cells already there."),
    "csv_out": ("--csv", "Write one line per cell to this CSV file."),
    "plot_dir": ("--plot", "Write one heatmap per row (map-ROW.png) into this directory."),
}


def _config(path: Path) -> tuple[dict[str, Any], Any]:
    """Flag values (by parameter name) and the [cluster] table of a --config file."""
    from laxflow.sim.serve_options import _read

    data = _read(path)
    where = f"--config: {str(path)!r}"
    known = {a.flag.lstrip("-"): a.name for a in AXES}
    known.update({flag.lstrip("-"): name for name, (flag, _, _) in OTHER.items()})
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "cluster":
            continue
        name = known.get(str(key))
        if name is None:
            raise UserError(f"{where}: unknown key {key!r} for sim map (expected cluster or one of "
                            f"{', '.join(known)})")
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        values[name] = value
    return values, data.get("cluster")


def _list(value: Any, flag: str) -> list[str]:
    names = [p.strip() for p in str(value).split(",") if p.strip()]
    if not names:
        raise UserError(f"{flag}: expected at least one comma-separated name")
    return names


def _typed(value: Any, kind: type, flag: str, low: float) -> Any:
    try:
        out = kind(value)
        if isinstance(value, bool) or (kind is int and float(value) != out) or not out >= low:
            raise ValueError
    except (TypeError, ValueError):
        raise UserError(f"{flag}: expected {'an integer' if kind is int else 'a number'} >= {low:g}, "
                        f"got {value!r}") from None
    return out


def _map(ctx: typer.Context, v: dict[str, Any]) -> None:
    from laxflow.sim.map import grid, output
    from laxflow.sim.map.run import Settings, run_map
    from laxflow.sim.serving.experiment import check_policies
    from laxflow.sim.workload import WORKLOADS

    table = None
    if v["config"] is not None:
        given, table = _config(v["config"])
        for name, value in given.items():
            if ctx.get_parameter_source(name).name not in ("COMMANDLINE", "ENVIRONMENT"):
                v[name] = value
    axes = {a.name: grid.parse_axis(a, v[a.name]) for a in AXES}
    g = str(v["grid"])
    if g not in GRIDS:
        raise UserError(f"--grid: unknown {g!r} (expected one of {', '.join(GRIDS)})")
    base_load = _typed(v["base_load"], float, "--base-load", 0.0)
    if not 0 < base_load <= grid.MAX_LOAD:
        raise UserError(f"--base-load: expected a fraction of capacity in (0, {grid.MAX_LOAD:g}], got {base_load!r}")
    policies = _list(v["policies"], "--policies")
    check_policies(policies)
    if "mfs" not in policies or not any(p in ("fs", "sjf", "edf", "karuna") for p in policies):
        raise UserError(f"--policies: expected mfs and at least one baseline (fs, sjf, edf, karuna), "
                        f"got {','.join(policies)}")
    nseeds = _typed(v["seeds"], int, "--seeds", 1)
    if nseeds > MAX_SEEDS:
        raise UserError(f"--seeds: expected at most {MAX_SEEDS}, got {nseeds}")
    first = _typed(v["seed"], int, "--seed", 0)
    requests = _typed(v["requests"], int, "--requests", 1)
    warmup = _typed(v["warmup"], int, "--warmup", 0)
    servers = _typed(v["servers"], int, "--servers", 2)
    slo_scale = _typed(v["slo_scale"], float, "--slo-scale", 0.0)
    if not slo_scale > 0:
        raise UserError(f"--slo-scale: expected a positive number, got {slo_scale!r}")
    from laxflow.sim.serving.config import TOPOLOGIES

    if v["topology"] not in TOPOLOGIES:
        raise UserError(f"--topology: unknown {v['topology']!r} (expected one of {', '.join(TOPOLOGIES)})")
    workload = v["workload"]
    if workload is not None and workload not in WORKLOADS:
        raise UserError(f"--workload: unknown {workload!r} (expected one of {', '.join(WORKLOADS)})")
    jobs = _typed(v["jobs"], int, "--jobs", 0)
    rows = []
    if table is not None:
        rows.append(grid.user_row(table, f"--config: {str(v['config'])!r}", workload, v["topology"], servers))
    models_given = ctx.get_parameter_source("models").name == "COMMANDLINE" or (
        v["config"] is not None and "models" in _config(v["config"])[0])
    if table is None or models_given:
        rows.extend(grid.catalog_row(m, workload, v["topology"], servers) for m in _list(v["models"], "--models"))
    labels = [r.label for r in rows]
    if len(set(labels)) != len(labels):
        raise UserError(f"--models: a row appears twice ({', '.join(labels)}); give each once")
    for r in rows:
        if r.workload not in WORKLOADS:
            raise UserError(f"--workload: {r.label}: {r.workload!r} is not a calibrated workload "
                            f"(expected one of {', '.join(WORKLOADS)})")
    grid.check_axes(rows, axes)
    for r in rows:  # every row fits its cluster (one unit of prefill and of decode)
        from laxflow.sim.serving.config import ClusterConfig, ServingConfig
        from laxflow.sim.serving.experiment import prefill_gpus

        prefill_gpus(ServingConfig(model=r.model, deployment=r.deployment,
                                   cluster=ClusterConfig(servers=r.servers, topology=r.topology)))
    cells = grid.cells(rows, axes, g, base_load)
    for flag, path in (("--json", v["json_out"]), ("--csv", v["csv_out"])):
        if path is not None:
            if path.is_dir():
                raise UserError(f"{flag}: {str(path)!r} is a directory, expected a file")
            if not path.parent.is_dir():
                raise UserError(f"{flag}: no such directory {str(path.parent)!r}")
    plot_dir = v["plot_dir"]
    if plot_dir is not None:
        if plot_dir.exists() and not plot_dir.is_dir():
            raise UserError(f"--plot: {str(plot_dir)!r} is not a directory")
        plot_dir.mkdir(parents=True, exist_ok=True)
    physics = _physics(str(v["physics"]))
    settings = Settings(requests, warmup, list(range(first, first + nseeds)), slo_scale, policies, g, base_load,
                        physics)
    if v["dry_run"]:
        out = settings.as_dict(rows)
        out["cells"] = len(cells)
        out["runs"] = len(cells) * len(policies) * nseeds
        out["cell_keys"] = [c.key for c in cells]
        import json

        print(json.dumps(out, indent=1))
        return
    from laxflow.sim.serving.experiment import default_jobs

    results = run_map(rows, cells, settings, v["json_out"], jobs or default_jobs(), v["ray_address"], v["quiet"])
    _table(results, sys.stdout)
    if v["json_out"] is not None:
        print(f"laxflow: {_cells(len(results))} in {str(v['json_out'])!r}", file=sys.stderr)
    if v["csv_out"] is not None:
        output.write_csv(v["csv_out"], results)
        print(f"laxflow: {_cells(len(results))} written to {str(v['csv_out'])!r}", file=sys.stderr)
    if plot_dir is not None:
        for r in rows:
            mine = [c for c in results if c["row"] == r.label]
            path = output.plot_file(plot_dir, r.label)
            output.plot_row(path, r.label, mine, grid.slice_base(r, axes, g, base_load))
            print(f"laxflow: plot written to {str(path)!r}", file=sys.stderr)


def _physics(spec: str) -> str:
    """``--physics`` as the map runs it: its choices but the MoE exchange (the --ep-comm axis), by name."""
    from laxflow.sim.serving.config import parse_physics, physics_name

    try:
        values = parse_physics(spec)
    except UserError as exc:
        raise UserError(f"--physics: {str(exc).replace('physics: ', '', 1)}") from None
    if values["ep_comm"] is not None:
        print(f"laxflow: --physics {spec}: the MoE exchange stays the --ep-comm axis (ep_comm={values['ep_comm']} "
              "is not applied; give --ep-comm for it)", file=sys.stderr)
    return physics_name({**values, "ep_comm": None})


def _cells(n: int) -> str:
    return f"{n} cell{'' if n == 1 else 's'}"


def _table(results: list[dict[str, Any]], stream: Any) -> None:
    """One line per cell: its parameters, MFS - best baseline (paired), FS CCT inflation."""
    from rich.console import Console
    from rich.table import Table

    from laxflow.sim.serving.report import terminal_width

    table = Table(title="laxflow sim map (* paired 95 % interval of MFS - best baseline excludes 0; remote reuse: "
                        "the knob (the share of reused tokens fetched remotely))")
    for head in ("row", "nic\nGbit/s", "ep", "ep comm", "kv", "remote\nreuse", "prompt\nx", "load", "rate\nreq/s/GPU",
                 "best\nbase",
                 "MFS - best\n(paired)", "MFS / best", "FS CCT\ninflation"):
        table.add_column(head, justify="left" if head in ("row", "ep comm", "kv", "best\nbase") else "right",
                         no_wrap=True)
    for c in results:
        d = c.get("paired_diff") or {}
        ci = d.get("ci95")
        diff = "-" if d.get("mean") is None else f"{d['mean']:+.3f}" + ("" if ci is None else f" ± {ci:.3f}") + (
            " *" if d.get("excludes_0") else "")
        fci = c.get("fs_cct_inflation_ci95")
        fs = "-" if c.get("fs_cct_inflation") is None else f"{c['fs_cct_inflation']:.3f}" + (
            "" if fci is None else f" ± {fci:.3f}")
        ratio = "-" if c.get("mfs_over_best") is None else f"{c['mfs_over_best']:.3f}"
        share = c["remote_reuse"] if c["remote_reuse"] == "router" else f"{c['remote_reuse']:g}"
        table.add_row(c["row"], f"{c['nic_gbps']:g}", str(c["ep"]), c["ep_comm"], c["kv_placement"],
                      f"{share} ({c['remote_reuse_share']:.2f})", f"{c['prompt_scale']:g}", f"{c['load']:g}",
                      f"{c['rate']:.3g}", str(c.get("best_baseline") or "-"), diff, ratio, fs)
    Console(file=stream, width=terminal_width(stream), highlight=False).print(table)


def map_command(
    ctx: typer.Context,
    models: str = typer.Option(DEFAULT_MODELS, "--models", help=OTHER["models"][2]),
    workload: Optional[str] = typer.Option(None, "--workload", help=OTHER["workload"][2]),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML or YAML file: any flag without dashes, and a "
                                          "table named cluster with the user's row (name, model, gpu, gpus, tp, ep, sp, "
                                          "gpus_per_node, nic_gbps, intra_node_gbps, ep_comm, topology, servers, "
                                          "workload, deployment); command-line flags win."),
    nic_gbps: str = typer.Option(AX["nic_gbps"].default, AX["nic_gbps"].flag, help=AX["nic_gbps"].help),
    ep: str = typer.Option(AX["ep"].default, AX["ep"].flag, help=AX["ep"].help),
    ep_comm: str = typer.Option(AX["ep_comm"].default, AX["ep_comm"].flag, help=AX["ep_comm"].help),
    kv_placement: str = typer.Option(AX["kv_placement"].default, AX["kv_placement"].flag,
                                     help=AX["kv_placement"].help),
    remote_reuse: str = typer.Option(AX["remote_reuse"].default, AX["remote_reuse"].flag,
                                     help=AX["remote_reuse"].help),
    prompt_scale: str = typer.Option(AX["prompt_scale"].default, AX["prompt_scale"].flag,
                                     help=AX["prompt_scale"].help),
    load: str = typer.Option(AX["load"].default, AX["load"].flag, help=AX["load"].help),
    grid: str = typer.Option("star", "--grid", help=OTHER["grid"][2]),
    base_load: float = typer.Option(0.8, "--base-load", help=OTHER["base_load"][2]),
    policies: str = typer.Option(DEFAULT_POLICIES, "--policies", help=OTHER["policies"][2]),
    seeds: int = typer.Option(3, "--seeds", help=OTHER["seeds"][2]),
    seed: int = typer.Option(0, "--seed", help=OTHER["seed"][2]),
    requests: int = typer.Option(200, "--requests", help=OTHER["requests"][2]),
    warmup: int = typer.Option(100, "--warmup", help=OTHER["warmup"][2]),
    servers: int = typer.Option(16, "--servers", help=OTHER["servers"][2]),
    topology: str = typer.Option("fat-tree", "--topology", help=OTHER["topology"][2]),
    slo_scale: float = typer.Option(3.0, "--slo-scale", help=OTHER["slo_scale"][2]),
    physics: str = typer.Option("faithful", "--physics", help=OTHER["physics"][2]),
    json_out: Optional[Path] = typer.Option(None, "--json", help=OUTPUTS["json_out"][1]),
    csv_out: Optional[Path] = typer.Option(None, "--csv", help=OUTPUTS["csv_out"][1]),
    plot_dir: Optional[Path] = typer.Option(None, "--plot", help=OUTPUTS["plot_dir"][1]),
    jobs: int = typer.Option(0, "--jobs", help="Parallel worker processes (0: one per CPU, up to 8)."),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="Run on a Ray cluster at this address "
                                              "(extra 'ray')."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the settings, the number of cells and runs and "
                                 "every cell's key as JSON; run nothing."),
) -> None:
    """Map MFS over the best baseline, and FS's CCT inflation, across NIC, EP, reuse, prompt length and load."""
    _map(ctx, dict(locals()))


def register(app: typer.Typer) -> None:
    """Add ``map`` to the ``laxflow sim`` app."""
    app.command("map")(map_command)
