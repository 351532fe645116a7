"""Run the real ``laxflow`` entry point in this process (fast; same code path as the console script)."""

from __future__ import annotations

import sys
from unittest import mock

from laxflow.cli import main

# One 8-GPU Mixtral-8x7B prefill unit and one decode server: a run takes a fraction of a second.
TINY = ["--model", "mixtral-8x7b", "--servers", "2", "--workload", "qwen-agent", "--requests", "8", "--warmup", "2",
        "--jobs", "1"]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``laxflow ARGS``."""
    with mock.patch.object(sys, "argv", ["laxflow", *args]):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err
