"""Errors a user can cause.

Anything a user controls (a file, a flag, a frame, a trace line) that is wrong
raises :class:`UserError` with one line naming the thing and what was expected.
The CLI turns it into that one line on stderr and exit status 2.
"""


class UserError(Exception):
    """Bad input from a user: printed as one line, exit status 2."""

    exit_code = 2
