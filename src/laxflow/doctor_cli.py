"""``laxflow doctor``: preflight checks of a node before its daemon starts.

``laxflow.cli`` calls :func:`register` once when it assembles the app. The
checks themselves are :mod:`laxflow.doctor`; this module reads the flags and
the shell's environment, prints one line per check (status, check, what was
found -- what to do) or one JSON object, and exits 1 when any check failed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer


def doctor(
    ports: str = typer.Option("auto", "--ports", help="Ports file the daemon will get, or 'auto' (sysfs)."),
    user: Optional[str] = typer.Option(None, "--user", help="The serving job's user: can it reach the segment?"),
    group: Optional[str] = typer.Option(
        None, "--group", help="The group the daemon will share its segment and hooks socket with (config 'group')."
    ),
    shm: str = typer.Option("/laxflow", "--shm", help="The daemon's segment name."),
    hooks: Optional[str] = typer.Option(None, "--hooks", help="The daemon's hooks address (default: its default)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of lines."),
) -> None:
    """Check this node for laxflow: shim, line rates, /dev/shm, the job's user, NCCL/Mooncake env, DSCP trust."""
    from laxflow.daemon.config import default_hooks_address, runtime_dir
    from laxflow.doctor import FAIL, run_checks
    from laxflow.errors import UserError

    if not shm.startswith("/") or "/" in shm[1:] or len(shm) < 2:
        raise UserError(f"doctor: --shm: expected '/name', got {shm!r}")
    address = hooks or default_hooks_address(shm, runtime_dir(os.environ))
    if not address.startswith("ipc://"):
        raise UserError(f"doctor: --hooks: expected ipc://PATH, got {address!r}")
    checks = run_checks(ports, user, group, shm, address[len("ipc://"):], os.environ)
    failed = sum(c.status == FAIL for c in checks)
    if as_json:
        print(json.dumps({"checks": [c.as_dict() for c in checks], "failed": failed}))
    else:
        for c in checks:
            print(c.line())
    if failed:
        sys.exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
