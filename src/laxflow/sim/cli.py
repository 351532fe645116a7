"""``laxflow sim ...``: run policies on scenarios and workloads."""

from __future__ import annotations

import typer

app = typer.Typer(help="Compare scheduling policies in simulation.", no_args_is_help=True)
