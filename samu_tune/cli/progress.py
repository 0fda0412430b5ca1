"""Progress of ``samu-tune profile``: a live rich display on a terminal, plain lines otherwise.

The live display (on stderr, transient: the result tables stay clean) shows shape n of N, the
candidate being evaluated with its phase and index, and elapsed time.  Without a terminal
(pipes, CI logs) one line per shape is printed to stderr, plus one per candidate with
``verbose``; with ``quiet`` (``--json`` without a terminal) nothing is printed.
"""
from __future__ import annotations

import sys
from typing import Optional

from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)

from ..tuner import TuneEvent
from . import console


class ProfileProgress:
    def __init__(self, total: int, *, verbose: bool = False, quiet: bool = False):
        self.total = total
        self.verbose = verbose
        self.err = console.err()
        self.live = self.err.is_terminal
        self.quiet = quiet and not self.live
        self._progress: Optional[Progress] = None
        self._task = None
        self._index = 0
        self._key = ""

    def __enter__(self) -> "ProfileProgress":
        if self.live:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                MofNCompleteColumn(), TextColumn("{task.fields[candidate]}"),
                TimeElapsedColumn(), console=self.err, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("shapes", total=self.total, candidate="")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _line(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def shape_start(self, index: int, key: str) -> None:
        self._index, self._key = index, key
        if self._progress is not None:
            self._progress.update(self._task, description=f"shape {index}/{self.total} {key}",
                                  candidate="starting")
        else:
            self._line(f"[{index}/{self.total}] {key}: tuning")

    def event(self, ev: TuneEvent) -> None:
        where = f"{ev.phase} {ev.index}/{ev.total} {ev.candidate}"
        if self._progress is not None:
            if ev.event == "start":
                self._progress.update(self._task, candidate=f"{where} ({ev.elapsed_s:.0f} s)")
        elif self.verbose and ev.event == "finish":
            state = f"{ev.time_ms:.4g} ms" if ev.status == "ok" else f"{ev.status}: {ev.reason}"
            self._line(f"    {where}: {state} ({ev.elapsed_s:.1f} s)")

    def shape_done(self, summary: str) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)
        else:
            self._line(f"[{self._index}/{self.total}] {self._key}: {summary}")
