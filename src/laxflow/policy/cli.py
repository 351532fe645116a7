"""``laxflow policy ...``: run policy pieces on files."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run MFS policy pieces (inter-request scheduling) on input files.", no_args_is_help=True)
