"""``laxflow daemon``: one node's scheduler.

``laxflow.cli`` calls :func:`register` once when it assembles the app. The
flags map onto :class:`~laxflow.daemon.config.DaemonConfig` through
:func:`~laxflow.daemon.config.load_config` (the only reader of the
environment and the config file).
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("daemon")
    def daemon_command(
        node: Optional[str] = typer.Option(None, "--node", help="This node's name in the cluster. Required, "
                                           "unless the --config file gives 'node'."),
        coordinator: Optional[str] = typer.Option(None, "--coordinator", help="Coordinator tcp://HOST:PORT; "
                                                  "without one the daemon schedules locally."),
        shm: Optional[str] = typer.Option(None, "--shm", help="Shared-memory segment (default $LAXFLOW_SHM_NAME "
                                          "or /laxflow)."),
        ports: Optional[str] = typer.Option(None, "--ports", help="NIC ports: a JSON ports file, or 'auto' (sysfs)."),
        line_rate: Optional[str] = typer.Option(None, "--line-rate", metavar="GBPS", help="With --ports auto: "
                                                "schedule one port at GBPS Gbit/s (the default route's interface) "
                                                "when no interface reports a link speed (virtio NICs)."),
        metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus metrics on this "
                                                   "port (0: any free one)."),
        metrics_bind: Optional[str] = typer.Option(None, "--metrics-bind", metavar="ADDR", help="Address the "
                                                   "metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 for "
                                                   "every interface)."),
        hooks: Optional[str] = typer.Option(None, "--hooks", help="Hooks server address, ipc://PATH."),
        group: Optional[str] = typer.Option(None, "--group", help="Unix group (name or gid) to share the segment, "
                                            "doorbell and hooks sockets with (mode 0660), so serving jobs of other "
                                            "users in it are scheduled; default: the daemon's user only (0600)."),
        config: Optional[str] = typer.Option(None, "--config", help="JSON config file (flags win)."),
        log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    ) -> None:
        """Run the node daemon: RMLQ per NIC port, permits and DSCP to the shims, reports to the coordinator."""
        from laxflow.daemon.config import load_config

        run_daemon(load_config({"node": node, "coordinator": coordinator, "shm": shm, "ports": ports,
                                "line_rate_gbps": line_rate, "metrics_port": metrics_port,
                                "metrics_bind": metrics_bind, "hooks": hooks, "group": group,
                                "config": config}), log_level)


def run_daemon(config, log_level: str = "info", unlink_on_exit: bool = False) -> None:
    """Build, run until SIGTERM/SIGINT, shut down (gates open), return (exit 0)."""
    from laxflow.daemon.service import Daemon
    from laxflow.errors import UserError

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise UserError(f"--log-level: expected debug, info, warning or error, got {log_level!r}")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s laxflow-daemon %(levelname)s %(message)s")
    daemon = Daemon(config, unlink_on_exit=unlink_on_exit)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stop())
    if daemon.metrics_port is not None:
        # One line a supervisor or test can read to find a port picked with --metrics-port 0.
        print(f"laxflow daemon: metrics on port {daemon.metrics_port}", file=sys.stderr, flush=True)
    try:
        daemon.run()
    finally:
        daemon.shutdown()
