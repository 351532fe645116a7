"""``laxflow sim flows``: run flow policies on a scenario file.

Registered on the ``laxflow sim`` app by :mod:`laxflow.sim.cli`. The scenario
and every policy name are validated before any policy runs, so a bad input
ends in one line and exit status 2 with nothing half-run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from laxflow.errors import UserError


def flows(
    scenario: Path = typer.Argument(..., help="Scenario JSON file (links and flows)."),
    policy: str = typer.Option("fs,sjf,edf", "--policy", "-p", help="Comma-separated policy names or module:Class."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per policy."),
) -> None:
    """Run each policy on SCENARIO and print finish times, due times and met deadlines."""
    from laxflow.sim.serving.experiment import check_policies
    from laxflow.sim.network.scenario import load_scenario, run_scenario

    names = [p.strip() for p in policy.split(",") if p.strip()]
    if not names:
        raise UserError("--policy: expected at least one policy name")
    check_policies(names, "--policy")
    loaded = load_scenario(scenario)
    results = [run_scenario(loaded, name) for name in names]
    if as_json:
        typer.echo(json.dumps(results, allow_nan=False))
    else:
        _print_tables(results)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.6g}" if math.isfinite(x) else str(x)


def _print_tables(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for result in results:
        flows = result["flows"]
        met = sum(1 for f in flows if f["met"])
        with_due = sum(1 for f in flows if f["met"] is not None)
        console.print(
            f"[bold]policy {result['policy']}[/bold]  makespan {_fmt(result['makespan'])}  "
            f"deadlines met {met}/{with_due}",
            highlight=False,
        )
        table = Table()
        table.add_column("flow")
        table.add_column("finish", justify="right")
        table.add_column("due", justify="right")
        table.add_column("met")
        for f in sorted(flows, key=lambda f: (f["finish"] is None, f["finish"] or 0.0)):
            met_text = "-" if f["met"] is None else ("yes" if f["met"] else "NO")
            table.add_row(f["id"], _fmt(f["finish"]), _fmt(f["due"]), met_text)
        console.print(table)


def register(app: typer.Typer) -> None:
    """Add the ``flows`` command to the ``laxflow sim`` app."""
    app.command("flows")(flows)
