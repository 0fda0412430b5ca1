"""Progress of ``samu-tune profile``: a live rich display on a terminal, plain lines otherwise.

The live display (on stderr, transient: the result tables stay clean) shows shape n of N, the
candidate being evaluated with its phase and index within the phase, the best candidate so
far and its time, the elapsed time and an estimate of what is left (the mean time of the
shapes done so far times the shapes left; none before the first shape is done).  Without a
terminal (pipes, CI logs) one line per shape is printed to stderr, plus one per candidate with
``verbose``; with ``quiet`` (``--json`` without a terminal) nothing is printed.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)

from samu_tune.results import TuneEvent
from samu_tune.cli import console


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
        self._t0 = time.monotonic()
        self._shape_t0 = self._t0
        self._done_s: list[float] = []      # seconds of each tuned shape
        self._served = 0                     # shapes served from the cache (about 0 s)
        self._best: Optional[tuple[float, str]] = None
        self._where = "starting"

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
        self._shape_t0 = time.monotonic()
        self._best, self._where = None, "starting"
        if self._progress is not None:
            self._progress.update(self._task, description=f"shape {index}/{self.total} {key}",
                                  candidate=self.status())
        else:
            self._line(f"[{index}/{self.total}] {key}: tuning")

    def left_s(self) -> Optional[float]:
        """Seconds left by the mean of the finished shapes; None before one is finished."""
        if not self._done_s:
            return None
        done = len(self._done_s)
        mean = sum(self._done_s) / done
        finished = done + self._served
        running = self._index > finished        # a shape started and not finished
        left = mean * max(0, self.total - finished - running)
        if running:
            left += max(0.0, mean - (time.monotonic() - self._shape_t0))
        return left

    def status(self) -> str:
        """The live line's right part: phase k/N candidate, best so far, elapsed, left."""
        parts = [self._where]
        if self._best is not None:
            parts.append(f"best {self._best[0]:.4g} ms {self._best[1]}")
        elapsed = time.monotonic() - self._t0
        left = self.left_s()
        parts.append(f"{elapsed:.0f} s" + ("" if left is None else f", ~{left:.0f} s left"))
        return " | ".join(parts)

    def event(self, ev: TuneEvent) -> None:
        where = f"{ev.phase} {ev.index}/{ev.total} {ev.candidate}"
        if ev.event == "start":
            self._where = where
        elif ev.status == "ok" and ev.time_ms is not None and (
                self._best is None or ev.time_ms < self._best[0]):
            self._best = (ev.time_ms, ev.candidate)
        if self._progress is not None:
            self._progress.update(self._task, candidate=self.status())
        elif self.verbose and ev.event == "finish":
            state = f"{ev.time_ms:.4g} ms" if ev.status == "ok" else f"{ev.status}: {ev.reason}"
            self._line(f"    {where}: {state} ({ev.elapsed_s:.1f} s)")

    def shape_done(self, summary: str, tuned: bool = True) -> None:
        """A shape finished: tuned now, or (``tuned`` False) served from the cache, which
        does not count in the estimate."""
        if tuned:
            self._done_s.append(time.monotonic() - self._shape_t0)
        else:
            self._served += 1
        if self._progress is not None:
            self._progress.advance(self._task)
        else:
            left = self.left_s()
            eta = "" if left is None or self._index >= self.total else f" (~{left:.0f} s left)"
            self._line(f"[{self._index}/{self.total}] {self._key}: {summary}{eta}")
