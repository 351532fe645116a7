"""Process plumbing the testbed's drivers share (scenario.py, mooncake_traffic.py)."""

from __future__ import annotations

import select
import subprocess

READY_TIMEOUT_S = 120.0  # a rank's set-up (imports, connections, Gloo's group) on a loaded box


def readline_within(p: subprocess.Popen[str], timeout: float) -> str:
    """One line of ``p``'s stdout within ``timeout`` s ('' if it ended or stayed silent)."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if ready else ""
