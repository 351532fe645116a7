"""The one ``laxflow`` command.

Each family adds its own subcommands from its own module (``laxflow.sim.cli``,
``laxflow.policy_cli``, ``laxflow.shim_cli``); this file only assembles them
and turns a :class:`~laxflow.errors.UserError` into one line and exit 2.
Heavy imports happen inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import sys

import typer

from laxflow import __version__
from laxflow.errors import UserError

app = typer.Typer(
    name="laxflow",
    help="Communication scheduler for disaggregated LLM serving (Multi-stage Flow Scheduling).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"laxflow {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """laxflow: which transfer of which request goes first."""


def _assemble() -> None:
    from laxflow.policy_cli import app as policy_app
    from laxflow.sim.cli import app as sim_app

    app.add_typer(sim_app, name="sim")
    app.add_typer(policy_app, name="policy")
    from laxflow.coordinator.cli import register as register_coordinator  # coordinator, keys
    from laxflow.status_cli import register as register_status

    register_coordinator(app)
    register_status(app)
    __import__("laxflow.daemon.cli", fromlist=["register"]).register(app)  # laxflow daemon
    try:
        from laxflow import shim_cli
    except ImportError:  # the native part is optional until it is built
        return
    shim_cli.register(app)


_assemble()


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except UserError as exc:
        print(f"laxflow: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
