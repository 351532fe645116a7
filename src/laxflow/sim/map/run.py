"""Running a map: each cell's capacity and rate, its runs, and the cells as they finish.

Called by :mod:`laxflow.sim.map_cli` in the CLI process after every flag is
checked. Runs go through :func:`laxflow.sim.serving.experiment.run_all`
(local processes with ``jobs``, or a Ray cluster), the same path as ``sim
sweep``; a cell's figures are computed and the ``--json`` file rewritten as
soon as its last run is back, so a map cut short resumes where it stopped.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from laxflow.sim.map import output
from laxflow.sim.map.figures import cell_figures
from laxflow.sim.map.grid import Cell, Row, variant

CAPACITY_REQUESTS = 1000  # requests the capacity of a cell is measured on (the method's default, seed 0)


@dataclass
class Settings:
    """What every cell shares (also the ``settings`` of the JSON file)."""

    requests: int
    warmup: int
    seeds: list[int]
    slo_scale: float
    policies: list[str]
    grid: str
    base_load: float
    physics: str = "faithful"  # config.parse_physics spec without an exchange (the --ep-comm axis decides it)

    def as_dict(self, rows: Sequence[Row]) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in output.SETTINGS}
        out["rows"] = {r.label: {"model": r.model, "workload": r.workload, "deployment": r.deployment.name,
                                 "gpus": r.deployment.gpus, "tp": r.deployment.tp, "ep": r.deployment.ep,
                                 "sp": r.deployment.sp, "gpu": r.deployment.gpu.name,
                                 "nic_gbps": r.deployment.nic_gbps, "gpus_per_node": r.deployment.gpus_per_node,
                                 "ep_comm": r.deployment.ep_comm, "topology": r.topology, "servers": r.servers}
                       for r in rows}
        return out


class Capacities:
    """Capacity (requests/s per prefill GPU) of each (row, NIC, EP, exchange, prompt scale), computed once.

    The method of ``experiment.CAPACITY`` (:func:`laxflow.sim.serving.capacity.capacity`): one unit
    alone, every prompt in full, collectives on an idle fabric, 99 % busy; here on the cell's own
    deployment, NIC and prompt lengths, so a load fraction means the same thing in every cell.
    """

    def __init__(self, physics: str = "faithful") -> None:
        self._known: dict[tuple, float] = {}
        self.physics = physics

    def get(self, row: Row, cell: Cell) -> float:
        key = (row.label, cell.nic_gbps, cell.ep, cell.ep_comm, cell.prompt_scale)
        if key not in self._known:
            from laxflow.sim import workload as wl
            from laxflow.sim.serving.capacity import capacity

            dep = variant(row, cell.nic_gbps, cell.ep, cell.ep_comm)
            reqs = wl.generate(row.workload, 1.0, CAPACITY_REQUESTS, 0, cell.prompt_scale)
            self._known[key] = capacity(row.model, row.workload, deployment=dep, servers=max(row.servers, 2 * dep.nodes),
                                        topology=row.topology, reqs=reqs, physics=self.physics).per_gpu_rate
        return self._known[key]


def specs_of(row: Row, cell: Cell, rate: float, settings: Settings) -> list[Any]:
    """Every (policy, seed) run of one cell, seed by seed."""
    from laxflow.sim.serving.config import ClusterConfig, ServingConfig
    from laxflow.sim.serving.experiment import RunSpec

    dep = variant(row, cell.nic_gbps, cell.ep, cell.ep_comm)
    config = ServingConfig(model=row.model, deployment=dep,
                           cluster=ClusterConfig(servers=row.servers, topology=row.topology),
                           slo_scale=settings.slo_scale, warmup=settings.warmup, kv_placement=cell.kv_placement,
                           remote_reuse=None if cell.remote_reuse == "router" else float(cell.remote_reuse)
                           ).with_physics(settings.physics)
    return [RunSpec(config, row.workload, rate, p, settings.requests, seed, prompt_scale=cell.prompt_scale)
            for seed in settings.seeds for p in settings.policies]


def run_map(rows: Sequence[Row], cells: Sequence[Cell], settings: Settings, json_path: Path | None, jobs: int,
            ray_address: str | None, quiet: bool, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run every cell not already in ``json_path``; returns every cell's result (file order, then new)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from laxflow.sim.serving.experiment import prefill_gpus, run_all

    say = log or (lambda text: print(f"laxflow: {text}", file=sys.stderr, flush=True))
    meta = settings.as_dict(rows)
    done = output.load(json_path, meta)
    by_label = {r.label: r for r in rows}
    wanted = list(cells)
    skipped = [c for c in wanted if c.key in done]
    todo = [c for c in wanted if c.key not in done]
    where = f" in {str(json_path)!r}" if json_path is not None else ""
    runs_per_cell = len(settings.policies) * len(settings.seeds)
    say(f"{len(wanted)} cells x {runs_per_cell} runs ({len(settings.policies)} policies x {len(settings.seeds)} seeds); "
        f"{len(skipped)} already{where}, not re-run; {len(todo)} to run ({len(todo) * runs_per_cell} runs)")
    results: dict[str, dict[str, Any]] = dict(done)
    if not todo:
        return [results[c.key] for c in wanted]
    caps = Capacities(settings.physics)
    if not quiet and todo:
        say(f"measuring the capacity of {len({(c.row, c.nic_gbps, c.ep, c.ep_comm, c.prompt_scale) for c in todo})} "
            "configurations (one unit alone, about half a second each)")
    specs: list[Any] = []
    owner: list[Cell] = []
    head: dict[str, dict[str, Any]] = {}
    for c in todo:
        row = by_label[c.row]
        cap = caps.get(row, c)
        rate = float(f"{cap * c.load:.4g}")
        mine = specs_of(row, c, rate, settings)
        head[c.key] = {"key": c.key, **c.params(), "deployment": mine[0].config.deployment.name,
                       "servers": row.servers, "topology": row.topology, "prefill_gpus": prefill_gpus(mine[0].config),
                       "capacity": round(cap, 5), "rate": rate}
        specs.extend(mine)
        owner.extend([c] * len(mine))
    index = {id(s): i for i, s in enumerate(specs)}
    pending: dict[str, list[dict[str, Any]]] = {c.key: [] for c in todo}
    t0 = time.perf_counter()

    def finish(spec: Any, row: dict[str, Any]) -> None:
        cell = owner[index[id(spec)]]
        got = pending[cell.key]
        got.append({k: row[k] for k in ("seed", "policy", "slo_attainment", "cct_inflation", "ttft_mean",
                                         "remote_reuse_share", "wall_s") if k in row})
        if len(got) == runs_per_cell:
            results[cell.key] = {**head[cell.key], **cell_figures(got, settings.policies)}
            if json_path is not None:
                output.write_json(json_path, meta, [results[k] for k in results])

    total = sum(s.requests + s.config.warmup for s in specs)
    with Progress(TextColumn("[bold]mapping[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), disable=quiet, transient=False,
                  console=Console(stderr=True)) as progress:
        task = progress.add_task(f"{len(todo)} cells, {len(specs)} runs, bar in requests", total=total)
        run_all(specs, jobs=jobs, ray_address=ray_address, on_progress=lambda n: progress.advance(task, n),
                on_done=finish)
    say(f"{len(todo)} cell{'' if len(todo) == 1 else 's'} run in {time.perf_counter() - t0:.1f} s")
    keys = [c.key for c in wanted]
    ordered = [results[k] for k in keys] + [v for k, v in results.items() if k not in set(keys)]
    if json_path is not None:  # the map's cells in grid order, then any other cells the file held
        output.write_json(json_path, meta, ordered)
    return [results[k] for k in keys]
