"""Consoles and errors of the CLI: rich on stdout/stderr, one-line failures with a status."""
from __future__ import annotations

import os
import sys

from rich.console import Console

# Width used when output is not a terminal (pipes, CI logs): rich's default of 80 columns
# would squeeze the result tables; COLUMNS still wins when set.
PIPE_WIDTH = 160


class CLIError(Exception):
    """A user error: printed as ``samu-tune: error: <message>``, exit ``status`` (no traceback)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    width = None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def out() -> Console:
    """Console on the current ``sys.stdout`` (created per call so captured output works)."""
    return _console(stderr=False)


def err() -> Console:
    """Console on the current ``sys.stderr``: progress, notices in ``--json`` mode."""
    return _console(stderr=True)


def error(message: str) -> None:
    print(f"samu-tune: error: {message}", file=sys.stderr)
