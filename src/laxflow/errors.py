"""Errors a user can cause.

Anything a user controls (a file, a flag, a frame, a trace line) that is wrong
raises :class:`UserError` with one line naming the thing and what was expected.
The CLI turns it into that one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input from a user: printed as one line, exit status 2."""

    exit_code = 2


@contextmanager
def user_errors(prefix: str = "") -> Iterator[None]:
    """Turn a ``ValueError`` raised inside into a :class:`UserError` (``prefix: message``).

    For code that validates with ValueError because it is also called from
    library code (the policy registry, the DSCP map, the stage parser); where
    a user's input reaches it, the caller wraps it in this once.
    """
    try:
        yield
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(f"{prefix}: {exc}" if prefix else str(exc)) from None


def clip(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis (for quoting a user's file)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def json_error(exc: json.JSONDecodeError, *, line: bool = True) -> str:
    """``Expecting value at line 3 column 5`` from a decode error.

    Some of the decoder's messages end in "at" already ("Unterminated string
    starting at"), which must not become "at at".
    """
    msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
    return f"{msg} at line {exc.lineno} column {exc.colno}" if line else f"{msg} at column {exc.colno}"


def read_json_file(path: "str | os.PathLike[str]", what: str) -> Any:
    """Parse a user's JSON file; any failure is one UserError naming the file.

    ``what`` says what the file is for ("scenario file", "inter input"), so
    the message reads ``<path>: <what>: cannot read (...)`` or ``not valid
    JSON (... at line L column C)``.
    """
    source = str(path)
    if Path(path).is_dir():
        raise UserError(f"{source}: {what}: is a directory, expected a file")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{source}: {what}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{source}: {what}: not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{source}: {what}: not valid JSON ({json_error(exc)})") from None
