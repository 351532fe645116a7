"""``laxflow policy ...``: run policy pieces on files, and the parsing of those files.

Kept out of :mod:`laxflow.policy` so that package stays pure (no files, no
CLI); the top-level CLI (:mod:`laxflow.cli`) mounts :data:`app`.

``inter`` runs the coordinator's inter-request scheduling (RED order,
worst-case feasibility, pruning; Appendix B, Algorithm 1) on a JSON file.
``dscp`` prints the level -> DSCP map the node daemons tag traffic with and
the switch configuration is derived from. Both exit 2 with one line on bad
input (the top-level CLI turns :class:`~laxflow.errors.UserError` into that).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from laxflow.errors import UserError, read_json_file
from laxflow.policy.inter_request import InterBatch, InterProblem, InterRequest

app = typer.Typer(help="Run MFS policy pieces (inter-request scheduling) on input files.", no_args_is_help=True)


@app.command("inter")
def inter(
    file: Path = typer.Argument(..., help="JSON: now, drop_budget, ports {id: bytes/s}, batches [...]."),
    as_json: bool = typer.Option(False, "--json", help="Print {order, red, finish, pruned} as JSON."),
) -> None:
    """RED order, each batch's RED and estimated finish, and the pruned requests."""
    from laxflow.policy.inter_request import schedule

    result = schedule(parse_problem(read_json_file(file, "inter input")))
    if as_json:
        typer.echo(json.dumps(result.as_json(), indent=2))
        return
    typer.echo(f"{'rank':>4}  {'batch':<16} {'RED':>12} {'est. finish':>12}")
    for rank, batch in enumerate(result.order):
        typer.echo(f"{rank:>4}  {batch:<16} {result.red[batch]:>12.6g} {result.finish[batch]:>12.6g}")
    pruned = ", ".join(result.pruned) if result.pruned else "none"
    typer.echo(f"pruned (scavenger class): {pruned}")


@app.command("dscp")
def dscp(
    levels: int = typer.Option(8, "--levels", "-k", help="Number of RMLQ levels K."),
    as_json: bool = typer.Option(False, "--json", help="Print the map as JSON."),
) -> None:
    """The default level -> DSCP -> switch traffic class map for K levels."""
    from laxflow.policy.dscp import default_dscp_map

    try:
        table = default_dscp_map(levels)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(table.as_json(), indent=2))
        return
    typer.echo(f"{'level':<12} {'DSCP':>4} {'TC':>3}  meaning")
    for row in table.rows():
        typer.echo(f"{row['level']:<12} {row['dscp']:>4} {row['tc']:>3}  {row['meaning']}")


# ---------------------------------------------------------------- input file



def parse_problem(data: Any) -> InterProblem:
    """Validate a decoded ``laxflow policy inter`` file; UserError on the first problem."""
    if not isinstance(data, dict):
        raise UserError("inter input: expected a JSON object with 'ports' and 'batches'")
    unknown = set(data) - {"description", "now", "drop_budget", "ports", "batches"}
    if unknown:
        raise UserError(
            f"inter input: unknown key {sorted(unknown)[0]!r} (expected description, now, drop_budget, ports, batches)"
        )
    now = _number(data.get("now", 0.0), "'now'")
    budget = data.get("drop_budget", 0)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise UserError(f"inter input: 'drop_budget' must be a non-negative integer, got {budget!r}")
    ports = data.get("ports")
    if not isinstance(ports, dict) or not ports:
        raise UserError("inter input: 'ports' must be a non-empty object of port id -> bandwidth (bytes/s)")
    bw: dict[str, float] = {}
    for p, v in ports.items():
        value = _number(v, f"port {p!r} bandwidth")
        if value <= 0:
            raise UserError(f"inter input: port {p!r} bandwidth must be > 0, got {v!r}")
        bw[str(p)] = value
    raw_batches = data.get("batches")
    if not isinstance(raw_batches, list):
        raise UserError("inter input: 'batches' must be a list")
    batch_ids: set[str] = set()
    request_ids: set[str] = set()
    batches = []
    for k, raw in enumerate(raw_batches):
        if not isinstance(raw, dict):
            raise UserError(f"inter input: batch #{k} must be an object")
        bid = _ident(raw.get("id"), f"batch #{k}")
        if bid in batch_ids:
            raise UserError(f"inter input: duplicate batch id {bid!r}")
        batch_ids.add(bid)
        compute = _number(raw.get("compute", 0.0), f"batch {bid!r} compute")
        if compute < 0:
            raise UserError(f"inter input: batch {bid!r} compute must be >= 0, got {compute!r}")
        raw_reqs = raw.get("requests")
        if not isinstance(raw_reqs, list) or not raw_reqs:
            raise UserError(f"inter input: batch {bid!r} is empty (expected a non-empty 'requests' list)")
        reqs = []
        for j, rr in enumerate(raw_reqs):
            if not isinstance(rr, dict):
                raise UserError(f"inter input: batch {bid!r} request #{j} must be an object")
            rid = _ident(rr.get("id"), f"batch {bid!r} request #{j}")
            if rid in request_ids:
                raise UserError(f"inter input: duplicate request id {rid!r}")
            request_ids.add(rid)
            deadline = _number(rr.get("deadline"), f"request {rid!r} deadline")
            raw_load = rr.get("load", {})
            if not isinstance(raw_load, dict):
                raise UserError(f"inter input: request {rid!r} load must be an object of port id -> bytes")
            load: dict[str, float] = {}
            for p, v in raw_load.items():
                if p not in bw:
                    raise UserError(f"inter input: request {rid!r} names unknown port {p!r} (ports: {', '.join(sorted(bw))})")
                value = _number(v, f"request {rid!r} load on {p!r}")
                if value < 0:
                    raise UserError(f"inter input: request {rid!r} load on {p!r} must be >= 0, got {v!r}")
                load[p] = value
            reqs.append(InterRequest(rid, deadline, load))
        batches.append(InterBatch(bid, compute, tuple(reqs)))
    return InterProblem(ports=bw, batches=tuple(batches), now=now, drop_budget=budget)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"inter input: {what} must be a finite number, got {value!r}")
    return float(value)


def _ident(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"inter input: {what} needs a non-empty string 'id', got {value!r}")
    return value
