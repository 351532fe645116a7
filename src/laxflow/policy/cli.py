"""``laxflow policy ...``: run policy pieces on files.

``inter`` runs the coordinator's inter-request scheduling (RED order,
worst-case feasibility, pruning; Appendix B, Algorithm 1) on a JSON file.
``dscp`` prints the level -> DSCP map the node daemons tag traffic with and
the switch configuration is derived from. Both exit 2 with one line on bad
input (the top-level CLI turns :class:`~laxflow.errors.UserError` into that).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from laxflow.errors import read_json_file, user_errors

app = typer.Typer(help="Run MFS policy pieces (inter-request scheduling) on input files.", no_args_is_help=True)


@app.command("inter")
def inter(
    file: Path = typer.Argument(..., help="JSON: now, drop_budget, ports {id: bytes/s}, batches [...]."),
    as_json: bool = typer.Option(False, "--json", help="Print {order, red, finish, pruned} as JSON."),
) -> None:
    """RED order, each batch's RED and estimated finish, and the pruned requests."""
    from laxflow.policy.inter_request import parse_problem, schedule

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

    with user_errors("--levels"):
        table = default_dscp_map(levels)
    if as_json:
        typer.echo(json.dumps(table.as_json(), indent=2))
        return
    typer.echo(f"{'level':<12} {'DSCP':>4} {'TC':>3}  meaning")
    for row in table.rows():
        typer.echo(f"{row['level']:<12} {row['dscp']:>4} {row['tc']:>3}  {row['meaning']}")
