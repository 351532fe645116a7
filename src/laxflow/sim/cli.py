"""``laxflow sim ...``: run policies on scenarios and workloads."""

from __future__ import annotations

import typer

app = typer.Typer(help="Compare scheduling policies in simulation.", no_args_is_help=True)

# Each command family registers itself from its own module.
from laxflow.sim import flows_cli  # noqa: E402

flows_cli.register(app)
from laxflow.sim import serve_cli  # noqa: E402

serve_cli.register(app)
from laxflow.sim import list_cli  # noqa: E402

list_cli.register(app)
from laxflow.sim import map_cli  # noqa: E402

map_cli.register(app)
