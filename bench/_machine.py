"""The CPU a benchmark ran on, for the ``machine`` its JSON names (bench scripts import it).

Not a benchmark: ``bench/control_plane.py``, ``bench/shim.py`` and
``bench/testbed_ratio.py`` call :func:`cpu_model` when they describe the box.
"""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """``model name`` of /proc/cpuinfo, else what ``platform`` says (the processor, else the machine type)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
