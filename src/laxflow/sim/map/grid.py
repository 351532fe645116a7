"""The map's axes, its cells, and each cell's deployment.

Called by :mod:`laxflow.sim.map_cli` in the CLI process before anything runs:
every axis value is checked here against every model it applies to, so a bad
value ends in one line naming the flag, the model and what would fit.

A cell is one point of the parameter space: a model (its deployment, possibly
a user's from ``--config``) on a workload, and one value per axis:

* ``nic_gbps``: NIC bandwidth per GPU (the deployment's ``nic_gbps``);
* ``ep``, ``ep_comm``: expert-parallel degree and how the MoE exchange moves
  tokens (``Deployment.ep`` / ``ep_comm``: ``hierarchical`` or ``allgather``,
  see :mod:`laxflow.sim.models.collectives`); a dense model has no EP and
  keeps ``ep = 1`` and its own ``ep_comm`` in every cell;
* ``kv_placement``: where reusable KV lives (``pool``: fetched from the unit
  that computed it; ``local-cache``: copied where used), which sets how much
  of the reused prefix is fetched remotely (each cell reports the share it got);
* ``remote_reuse``: ``router`` (the router's own trade-off between prefix
  overlap and load), or the share of requests with a cached prefix sent away
  from the unit holding most of it (``ServingConfig.remote_reuse``); each cell
  reports the share of reused tokens it actually fetched remotely;
* ``prompt_scale``: the workload's prompt lengths times this
  (:func:`laxflow.sim.workload.generate`);
* ``load``: the request rate as a fraction of the cell's capacity
  (:mod:`laxflow.sim.serving.capacity`, the method of ``experiment.CAPACITY``).

Grids: ``star`` (the default) is the base point plus one axis at a time
around it (every other axis at its base value); ``product`` is every
combination.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

from laxflow.errors import UserError

GRIDS = ("star", "product")


@dataclass(frozen=True)
class Axis:
    """One axis: its cell field, its flag, how a value is parsed, and its default values."""

    name: str
    flag: str
    parse: Callable[[str], Any]
    default: str
    help: str


def _number(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError
    return value


def _share(text: str) -> Any:
    """``router`` (the router's own choice) or a share in [0, 1]."""
    if text == "router":
        return text
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError
    return value


def _int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


AXES: tuple[Axis, ...] = (
    Axis("nic_gbps", "--nics", _number, "25,50,100,200,400", "NIC bandwidth per GPU, Gbit/s."),
    Axis("ep", "--ep", _int, "2,4,8", "Expert-parallel degrees (MoE models; each must divide the model's experts "
         "and the unit's GPUs)."),
    Axis("ep_comm", "--ep-comm", str, "hierarchical,allgather", "MoE exchanges: hierarchical (DeepEP: once per "
         "token and remote node), allgather (vLLM's allgather_reducescatter rings) or pairwise (a flat all-to-all, "
         "every token to each of its experts' GPUs: the MFS paper's)."),
    Axis("kv_placement", "--kv-placements", str, "pool,local-cache", "Where reusable KV lives: pool (fetched from "
         "its owner: most reuse remote) or local-cache (copied where used: little remote)."),
    Axis("remote_reuse", "--remote-reuse", _share, "router,0,0.5,1", "Share of requests sent away from the unit "
         "holding most of their cached prefix (their reuse fetched remotely), or router (its own prefix/load "
         "trade-off)."),
    Axis("prompt_scale", "--prompt-scales", _number, "0.5,1,2", "Prompt lengths x this (the workload's shape kept)."),
    Axis("load", "--loads", _number, "0.5,0.6,0.7,0.8,0.9,0.95", "Request rate as a fraction of the cell's "
         "capacity."),
)
AXIS_NAMES = tuple(a.name for a in AXES)
EXPECTED = {"nic_gbps": "positive numbers (Gbit/s)", "ep": "positive integers", "ep_comm": "names",
            "kv_placement": "names", "remote_reuse": "shares in [0, 1] or router", "prompt_scale": "positive numbers", "load": "positive numbers"}
MAX_LOAD = 2.0  # beyond twice the capacity every policy misses nearly everything


def parse_axis(axis: Axis, text: str) -> list[Any]:
    """``text`` (comma-separated) as the axis's values, in order, without repeats; or one UserError."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise UserError(f"{axis.flag}: expected at least one comma-separated value")
    try:
        values = [axis.parse(p) for p in parts]
    except ValueError:
        raise UserError(f"{axis.flag}: expected comma-separated {EXPECTED[axis.name]}, got {text!r}") from None
    if axis.name == "load" and any(v > MAX_LOAD for v in values):
        raise UserError(f"{axis.flag}: expected fractions of capacity up to {MAX_LOAD:g}, got {text!r}")
    if axis.name == "kv_placement":
        from laxflow.sim.serving.config import KV_PLACEMENTS

        for v in values:
            if v not in KV_PLACEMENTS:
                raise UserError(f"{axis.flag}: unknown {v!r} (expected one of {', '.join(KV_PLACEMENTS)})")
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class Row:
    """One model of the map: its deployment (catalog or a user's), workload and topology."""

    label: str  # the model's name, or the user's deployment name
    model: str
    workload: str
    deployment: Any  # laxflow.sim.models.Deployment
    topology: str
    servers: int

    @property
    def is_moe(self) -> bool:
        from laxflow.sim.models import get_model

        return get_model(self.model).is_moe


@dataclass(frozen=True)
class Cell:
    """One point of the map (its values are JSON-able; ``key`` names it in the output file)."""

    row: str
    model: str
    workload: str
    nic_gbps: float
    ep: int
    ep_comm: str
    kv_placement: str
    remote_reuse: Any  # "router" or a share in [0, 1]
    prompt_scale: float
    load: float

    @property
    def key(self) -> str:
        return "|".join([self.row, self.workload] + [f"{a}={getattr(self, a)}" for a in AXIS_NAMES])

    def params(self) -> dict[str, Any]:
        return asdict(self)


def variant(row: Row, nic_gbps: float, ep: int, ep_comm: str, flag: str = "") -> Any:
    """``row``'s deployment with this NIC, EP degree and exchange; a misfit is one UserError naming ``flag``."""
    from laxflow.sim.models import get_model

    dep = row.deployment
    try:
        out = replace(dep, nic_gbps=float(nic_gbps), ep=int(ep), ep_comm=ep_comm,
                      name=f"{dep.name}/ep{ep}-{ep_comm}-{nic_gbps:g}g")
        out.check_model(get_model(row.model))
    except UserError as exc:
        where = f"{flag}: " if flag else ""
        raise UserError(f"{where}{row.label}: {exc}") from None
    return out


def base_point(row: Row, base_load: float) -> dict[str, Any]:
    """The base value of every axis for ``row``: its deployment's, the pool placement, scale 1."""
    dep = row.deployment
    return {"nic_gbps": float(dep.nic_gbps), "ep": int(dep.ep), "ep_comm": dep.ep_comm, "kv_placement": "pool",
            "remote_reuse": "router", "prompt_scale": 1.0, "load": base_load}


def check_axes(rows: Sequence[Row], axes: dict[str, list[Any]]) -> None:
    """Every EP degree and exchange fits every MoE row (one UserError naming the flag otherwise)."""
    for row in rows:
        if not row.is_moe:
            continue
        dep = row.deployment
        for ep in axes["ep"]:
            variant(row, dep.nic_gbps, ep, dep.ep_comm, "--ep")
        for comm in axes["ep_comm"]:
            variant(row, dep.nic_gbps, dep.ep, comm, "--ep-comm")


def cells(rows: Sequence[Row], axes: dict[str, list[Any]], grid: str, base_load: float) -> list[Cell]:
    """The map's cells, row by row, without repeats (a dense row keeps its own EP on every cell)."""
    if grid not in GRIDS:
        raise UserError(f"--grid: unknown {grid!r} (expected one of {', '.join(GRIDS)})")
    out: dict[str, Cell] = {}
    for row in rows:
        base = base_point(row, base_load)
        mine = dict(axes)
        if not row.is_moe:  # no experts: nothing to spread or exchange
            mine["ep"], mine["ep_comm"] = [base["ep"]], [base["ep_comm"]]
        points: list[dict[str, Any]]
        if grid == "product":
            points = [dict(zip(AXIS_NAMES, combo)) for combo in itertools.product(*(mine[a] for a in AXIS_NAMES))]
        else:
            points = [dict(base)] + [{**base, a: v} for a in AXIS_NAMES for v in mine[a]]
        for p in points:
            cell = Cell(row.label, row.model, row.workload, **p)
            out.setdefault(cell.key, cell)
    return list(out.values())


def slice_base(row: Row, axes: dict[str, list[Any]], grid: str, base_load: float) -> dict[str, Any]:
    """The point the plot's one-axis-at-a-time slice goes through: the base, or in a product grid each
    axis's base value where the axis has it and its first value otherwise."""
    base = base_point(row, base_load)
    if grid == "star":
        return base
    out = {}
    for a in AXIS_NAMES:
        values = axes[a] if row.is_moe or a not in ("ep", "ep_comm") else [base[a]]
        out[a] = base[a] if base[a] in values else values[0]
    return out


# -- a user's cluster (--config FILE, table [cluster]) ----------------------------------------------------

# Keys of the [cluster] table: the row's name, model and workload, the Deployment fields a user sets, and
# the fabric (topology and servers of the whole cluster, half prefill and half decode).
DEPLOYMENT_KEYS = ("tp", "ep", "sp", "gpus", "gpus_per_node", "nic_gbps", "intra_node_gbps", "ep_comm")
CLUSTER_KEYS = ("name", "model", "workload", "deployment", "gpu", *DEPLOYMENT_KEYS, "topology", "servers")


def default_workload(model: str) -> str:
    """The workload a model's presets run (``experiment.CAPACITY``'s first pair for it), else qwen-conv."""
    from laxflow.sim.serving.experiment import CAPACITY

    return next((w for m, w in CAPACITY if m == model), "qwen-conv")


def catalog_row(model: str, workload: str | None, topology: str, servers: int) -> Row:
    """A row for a catalog model on its paper deployment."""
    from laxflow.sim.models import get_deployment, get_model

    try:
        get_model(model)
    except UserError:
        from laxflow.sim.models import MODELS

        raise UserError(f"--models: unknown {model!r} (expected one of {', '.join(MODELS)})") from None
    return Row(model, model, workload or default_workload(model), get_deployment(model), topology, servers)


def user_row(table: Any, where: str, workload: str | None, topology: str, servers: int) -> Row:
    """The row of a ``[cluster]`` table: a catalog deployment (``deployment``, default the model's) with
    the user's fields over it; every key is checked and a misfit is one UserError naming the key."""
    from laxflow.sim.models import DEPLOYMENTS, get_deployment, get_gpu, get_model
    from laxflow.sim.serving.config import TOPOLOGIES

    if not isinstance(table, dict):
        raise UserError(f"{where}: [cluster]: expected a table of keys ({', '.join(CLUSTER_KEYS)})")
    for key in table:
        if key not in CLUSTER_KEYS:
            raise UserError(f"{where}: [cluster]: unknown key {key!r} (expected one of {', '.join(CLUSTER_KEYS)})")
    model = table.get("model")
    if not isinstance(model, str):
        raise UserError(f"{where}: [cluster]: key 'model': expected a model name (laxflow sim list models)")
    with_where = lambda exc: UserError(f"{where}: [cluster]: {exc}")  # noqa: E731
    try:
        get_model(model)
        base_name = table.get("deployment", model if model in DEPLOYMENTS else None)
        if not isinstance(base_name, str):
            raise UserError(f"key 'deployment': expected a deployment name (one of {', '.join(DEPLOYMENTS)})")
        dep = get_deployment(base_name)
        if dep.model != model:
            raise UserError(f"key 'deployment': {base_name!r} is for model {dep.model!r}, not {model!r}")
        fields: dict[str, Any] = {}
        for key in DEPLOYMENT_KEYS:
            if key not in table:
                continue
            value = table[key]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if key == "ep_comm" and not isinstance(value, str) or key != "ep_comm" and not number:
                raise UserError(f"key {key!r}: expected {'a name' if key == 'ep_comm' else 'a number'}, "
                                f"got {value!r}")
            fields[key] = value
        if "gpu" in table:
            if not isinstance(table["gpu"], str):
                raise UserError(f"key 'gpu': expected a GPU name, got {table['gpu']!r}")
            fields["gpu"] = get_gpu(table["gpu"])
        name = table.get("name", "user")
        if not isinstance(name, str) or not name or "|" in name:
            raise UserError(f"key 'name': expected a non-empty name without '|', got {name!r}")
        dep = replace(dep, name=name, **fields)
        dep.check_model(get_model(model))
        topo = table.get("topology", topology)
        if topo not in TOPOLOGIES:
            raise UserError(f"key 'topology': unknown {topo!r} (expected one of {', '.join(TOPOLOGIES)})")
        nservers = table.get("servers", servers)
        if isinstance(nservers, bool) or not isinstance(nservers, int) or nservers < 2:
            raise UserError(f"key 'servers': expected an integer >= 2, got {nservers!r}")
        load = table.get("workload", workload or default_workload(model))
        if not isinstance(load, str):
            raise UserError(f"key 'workload': expected a workload name, got {load!r}")
    except UserError as exc:
        raise with_where(exc) from None
    return Row(name, model, load, dep, topo, nservers)
