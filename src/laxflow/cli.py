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
    from laxflow.testbed.cli import app as testbed_app

    register_coordinator(app)
    register_status(app)
    app.add_typer(testbed_app, name="testbed")
    __import__("laxflow.daemon.cli", fromlist=["register"]).register(app)  # laxflow daemon
    __import__("laxflow.doctor_cli", fromlist=["register"]).register(app)  # laxflow doctor
    try:
        from laxflow import shim_cli
    except ImportError:  # the native part is optional until it is built
        return
    shim_cli.register(app)


_assemble()


def _usage_line(exc: Exception) -> str:
    """A click usage error as one line: ``laxflow sim serve: No such option: --x (see --help)``."""
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    text = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    return f"{where}{text} (see {ctx.command_path + ' ' if ctx is not None else ''}--help)"


def main() -> None:
    """Console-script entry point: every error a user causes ends in one line on stderr."""
    try:
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:  # typer before it vendored click
        from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[no-redef]
    try:
        # standalone_mode=False: usage errors come back here instead of
        # being drawn as typer's multi-line box.
        code = app(standalone_mode=False)
    except UserError as exc:
        print(f"laxflow: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except NoArgsIsHelpError as exc:  # a bare group: its help, as before
        exc.show()
        sys.exit(exc.exit_code)
    except ClickException as exc:
        print(f"laxflow: error: {_usage_line(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("laxflow: aborted", file=sys.stderr)
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)
