"""``laxflow shim-path`` and ``laxflow run``: the shim's subcommands.

``laxflow.cli`` calls :func:`register` once when it assembles the app.
"""

from __future__ import annotations

import sys
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
    ) -> None:
        """Run CMD with the shim preloaded: laxflow run [--dscp N] -- CMD [ARGS...]."""
        from laxflow.shim import ShimConfig, daemon_status, exec_under_shim

        config = ShimConfig(dscp=dscp, shm_name=shm_name, stale_ms=stale_ms)
        if dscp is None:
            why = daemon_status(shm_name)
            if why is not None:
                print(
                    f"laxflow run: no live daemon ({why}); traffic passes through until one starts",
                    file=sys.stderr,
                )
        from laxflow.adapters.nccl import apply_run_env

        apply_run_env(dscp=dscp)  # NCCL / Gloo: NCCL_IB_TC, stage 2, profiler plugin
        exec_under_shim(list(ctx.args), config)
