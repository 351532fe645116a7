"""``laxflow shim-path`` and ``laxflow run``: the shim's subcommands.

``laxflow.cli`` calls :func:`register` once when it assembles the app.

``laxflow run -- CMD`` finds the node's daemon (its segment is live) and
execs CMD under the shim; with no daemon it starts one embedded in this
process for this node alone (no coordinator), runs CMD as a child, and when
CMD exits stops the daemon (gates open) and exits with CMD's status.
Only with ``--collectives nccl|gloo`` does the job get the collective
environment (``laxflow.adapters.nccl.apply_run_env``): without it its
untagged QPs and sockets are not scheduled as collectives.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add the shim's commands to the top-level app."""

    @app.command("shim-path")
    def shim_path_command() -> None:
        """Print the path of liblaxflow_shim.so (for LD_PRELOAD)."""
        from laxflow.shim import shim_path

        typer.echo(str(shim_path()))

    @app.command(
        "run",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def run_command(
        ctx: typer.Context,
        dscp: Optional[int] = typer.Option(
            None, "--dscp", help="Static mode: tag every TCP connection and QP with this DSCP (0..63), no daemon."
        ),
        shm_name: str = typer.Option("/laxflow", "--shm-name", help="Shared-memory segment of the node daemon."),
        stale_ms: Optional[int] = typer.Option(
            None, "--stale-ms", help="Pass traffic through when the daemon's heartbeat is older (default 100)."
        ),
        max_defer_ms: Optional[int] = typer.Option(
            None, "--max-defer-ms",
            help="Release a work request whose permit has not come after this long (default 300).",
        ),
        ports: str = typer.Option("auto", "--ports", help="Embedded daemon only: ports file or 'auto' (sysfs)."),
        line_rate: Optional[str] = typer.Option(
            None, "--line-rate", metavar="GBPS",
            help="Embedded daemon with --ports auto: one port at GBPS Gbit/s when no interface reports a link "
                 "speed (default: 100, with a warning).",
        ),
        no_daemon: bool = typer.Option(False, "--no-daemon", help="Never start an embedded daemon."),
        collectives: Optional[str] = typer.Option(
            None, "--collectives",
            help="The job runs collectives: 'nccl' (NCCL_IB_TC, the profiler plugin and "
                 "LAXFLOW_DEFAULT_STAGE=2: its untagged QPs and sockets are collective traffic) or 'gloo' "
                 "(LAXFLOW_DEFAULT_STAGE=2 only). Default: none of these; untagged traffic is not scheduled.",
        ),
    ) -> None:
        """Run CMD with the shim preloaded: laxflow run [--dscp N] [--collectives nccl|gloo] -- CMD [ARGS...]."""
        import os

        from laxflow.adapters.nccl import COLLECTIVES, apply_run_env
        from laxflow.errors import UserError
        from laxflow.shim import ShimConfig, daemon_status, exec_under_shim, invisible_paths

        if collectives is not None and collectives not in COLLECTIVES:
            raise UserError(f"--collectives: expected {' or '.join(COLLECTIVES)}, got {collectives!r}")
        config = ShimConfig(dscp=dscp, shm_name=shm_name, stale_ms=stale_ms, max_defer_ms=max_defer_ms)
        for what in invisible_paths(os.environ):
            print(f"laxflow run: warning: {what}", file=sys.stderr)
        if collectives is not None:
            apply_run_env(dscp=dscp, collectives=collectives)
        command = list(ctx.args)
        if not command:
            raise UserError("run: expected a command after '--' (laxflow run [--dscp N] -- CMD ...)")
        if dscp is not None or daemon_status(shm_name) is None:
            exec_under_shim(command, config)  # static mode, or the node's daemon is live
        if no_daemon:
            print(f"laxflow run: no live daemon ({daemon_status(shm_name)}); traffic passes through", file=sys.stderr)
            exec_under_shim(command, config)
        sys.exit(run_with_embedded_daemon(command, config, ports, line_rate))


def run_with_embedded_daemon(command: list[str], config, ports: str, line_rate: str | None = None) -> int:
    """One-node mode: a daemon thread in this process, CMD as a child; returns CMD's exit status."""
    from laxflow.daemon.config import load_config
    from laxflow.daemon.service import Daemon
    from laxflow.errors import UserError
    from laxflow.shim import shim_env

    node = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:64] or "local"
    flags = {"node": node, "shm": config.shm_name, "ports": ports}
    if config.stale_ms is not None:
        flags["stale_ms"] = config.stale_ms
    if line_rate is not None:
        flags["line_rate_gbps"] = line_rate
    try:
        daemon_config = load_config(flags)
    except UserError as exc:
        if ports != "auto" or line_rate is not None:
            raise
        # A container or VM whose interfaces report no speed: one port at a stated rate.
        daemon_config = load_config({**flags, "line_rate_gbps": 100})
        print(f"laxflow run: {exc}; scheduling one 100 Gbit/s port {daemon_config.core.ports[0].name!r} meanwhile",
              file=sys.stderr)
    daemon = Daemon(daemon_config, unlink_on_exit=True)
    loop = threading.Thread(target=daemon.run, name="laxflow-daemon", daemon=True)
    loop.start()
    print(f"laxflow run: started an embedded daemon on {config.shm_name} (this node only, no coordinator)",
          file=sys.stderr)
    env = shim_env(config)
    env["LAXFLOW_HOOKS"] = daemon_config.hooks
    try:
        try:
            child = subprocess.Popen(command, env=env)
        except FileNotFoundError:
            raise UserError(f"run: {command[0]!r}: command not found") from None
        except PermissionError:
            raise UserError(f"run: {command[0]!r}: not executable") from None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        rc = child.wait()
    finally:
        daemon.stop()
        loop.join(timeout=10)
        daemon.shutdown()
    return rc if rc >= 0 else 128 - rc
