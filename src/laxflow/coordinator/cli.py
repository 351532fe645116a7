"""``laxflow coordinator`` and ``laxflow keys``: flags mapped onto the typed configs.

Registered by :mod:`laxflow.cli`; the heavy imports (zmq, prometheus) happen
inside the commands so ``laxflow --help`` stays fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer


def coordinator(
    bind: str = typer.Option(..., "--bind", help="ROUTER address for daemon reports, tcp://HOST:PORT or ipc://PATH; PUB for decisions is PORT+1 (PATH.pub)."),
    curve_keys: Optional[Path] = typer.Option(None, "--curve-keys", help="Keys directory from `laxflow keys generate`; required unless binding to loopback."),
    insecure: bool = typer.Option(False, "--insecure", help="Bind a non-loopback address without CURVE (trusted networks only)."),
    require_keys: bool = typer.Option(False, "--require-keys", help="Refuse to start without --curve-keys, even on loopback (where otherwise any local process can register as a node)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus /metrics on this port."),
    metrics_bind: Optional[str] = typer.Option(None, "--metrics-bind", metavar="ADDR", help="Address /metrics listens on (default: the --bind host when it is one IP address, else 127.0.0.1; 0.0.0.0 for every interface)."),
    heartbeat: float = typer.Option(0.5, "--heartbeat", help="Heartbeat period daemons are told to use, s."),
    dead_after: float = typer.Option(2.0, "--dead-after", help="Silence after which a daemon's batches are dropped, s."),
    forget_after: float = typer.Option(600.0, "--forget-after", help="Silence after which a dead daemon leaves `laxflow status`, s."),
    drop_budget: int = typer.Option(1, "--drop-budget", help="Requests one run of Algorithm 1 may newly prune (0: order only)."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
) -> None:
    """Cluster coordinator (head node): RED order and pruning across requests, on batch arrival and departure."""
    from laxflow.coordinator.core import CoordinatorConfig
    from laxflow.coordinator.server import CoordinatorServer, ServerConfig
    from laxflow.errors import UserError

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise UserError(f"--log-level {log_level!r}: expected debug, info, warning or error")
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ServerConfig(
        bind=bind,
        curve_keys=str(curve_keys) if curve_keys else None,
        insecure=insecure,
        require_keys=require_keys,
        metrics_port=metrics_port,
        metrics_bind=metrics_bind,
        core=CoordinatorConfig(heartbeat_s=heartbeat, dead_after_s=dead_after, drop_budget=drop_budget,
                               forget_after_s=forget_after),
    )
    CoordinatorServer(config).serve(install_signals=True)


keys_app = typer.Typer(help="ZeroMQ CURVE keys for the coordinator and its clients.", no_args_is_help=True)


@keys_app.command("generate")
def keys_generate(
    directory: Path = typer.Argument(..., help="Directory to create (mode 0700; files 0600)."),
    client: list[str] = typer.Option(["client"], "--client", help="Client key name (repeat for several); added if DIR exists."),
) -> None:
    """Create the coordinator's key pair and client key pairs in DIR."""
    from laxflow.coordinator.keys import generate

    for path in generate(directory, client):
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add ``coordinator`` and ``keys`` to the root command."""
    app.command("coordinator")(coordinator)
    app.add_typer(keys_app, name="keys")
