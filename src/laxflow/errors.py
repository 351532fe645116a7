"""Errors a user can cause.

Anything a user controls (a file, a flag, a frame, a trace line) that is wrong
raises :class:`UserError` with one line naming the thing and what was expected.
The CLI turns it into that one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input from a user: printed as one line, exit status 2."""

    exit_code = 2


def read_json_file(path: "str | os.PathLike[str]", what: str) -> Any:
    """Parse a user's JSON file; any failure is one UserError naming the file.

    ``what`` says what the file is for ("scenario file", "inter input"), so
    the message reads ``<path>: <what>: cannot read (...)`` or ``not valid
    JSON (... at line L column C)``.
    """
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{source}: {what}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{source}: {what}: not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{source}: {what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
