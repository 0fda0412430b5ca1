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


def print_table(console: Console, table) -> None:
    """Print ``table`` at its natural width even when the terminal is narrower: rich would
    otherwise drop or ellipsize columns (a long line wrapping in the terminal loses nothing)."""
    import io

    probe = Console(width=1000, file=io.StringIO(), color_system=None)
    with probe.capture() as captured:
        probe.print(table)
    # +2: the trailing cell padding that rstrip() removed
    need = max((len(line.rstrip()) for line in captured.get().splitlines()), default=0) + 2
    if need > console.width:  # print(width=) cannot exceed the console's width: a wider one
        console = Console(file=console.file, width=need, highlight=False,
                          force_terminal=console.is_terminal, color_system=console.color_system)
    console.print(table, crop=False)
