"""What tuning measures, as data: :class:`Candidate` (one (strategy, config) evaluated),
:class:`TuneResult` (one :func:`samu_tune.tune` call), :class:`TuneEvent` (progress).  The
tuner writes them, the cache stores winners from them and the CLI renders them; none of those
imports another for these types."""
from __future__ import annotations

from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict

from samu_tune import timing  # noqa: F401  (TuneResult.timing's type)
from samu_tune.device import DeviceInfo
from samu_tune.problem import Problem

Phase = Literal["prior", "screen", "refine", "exhaustive", "retime"]
Status = Literal["ok", "failed", "skipped"]


def config_json(config: BaseModel | dict) -> dict[str, Any]:
    """A config as a JSON-able dict (the cache's form)."""
    return config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)


def candidate_name(strategy: str, config: BaseModel | dict) -> str:
    """``chunk[block_m=64,chunk=32]`` (or the bare name for a config without fields)."""
    items = config_json(config)
    if not items:
        return strategy
    return strategy + "[" + ",".join(f"{k}={v}" for k, v in items.items()) + "]"


class TuneEvent(BaseModel):
    """What :func:`tune` reports to ``progress``.

    Phases ``prior``, ``screen``, ``refine`` and ``exhaustive`` send a ``start`` and a
    ``finish`` event per evaluated candidate; ``retime`` sends one ``finish`` per re-timed candidate after the
    interleaved rounds (with its final time).  ``index`` (1-based) and ``total`` count
    candidates within ``phase``; in ``refine`` ``total`` is an estimate that can grow (never
    above the ``max_configs`` left).  ``status``, ``time_ms`` and ``reason`` are set on
    ``finish`` events; ``elapsed_s`` is seconds since :func:`tune` started.
    """

    model_config = ConfigDict(frozen=True)

    event: Literal["start", "finish"]
    phase: Phase
    candidate: str
    strategy: str
    config: dict[str, Any]
    index: int
    total: int
    elapsed_s: float
    status: Optional[Status] = None
    time_ms: Optional[float] = None
    reason: Optional[str] = None


ProgressFn = Callable[[TuneEvent], None]


class Candidate(BaseModel):
    """One evaluated (strategy, config): its time, or why it failed or was skipped.

    ``time_ms`` is the final median (the interleaved re-timing for the top candidates, else
    the first measurement, which is kept in ``screen_ms``).  On CUDA these are GPU times and
    ``host_ms`` is the median host time of one call (dispatch and launches, not synchronised;
    see :mod:`samu_tune.timing`): a call with ``host_ms > time_ms`` is launch-bound when run
    alone.  ``verified_on`` is the key of the problem verification ran on, ``verified_in``
    where (``"worker"``: a compile-pool worker, :mod:`samu_tune.compile_pool`, its seconds in
    ``verify_s``; ``"cache"``: a stored pass of the same verification, :mod:`samu_tune.verified`;
None: the tuning process); ``warmup_s`` the first call at the real shape
    (compile cost, unless a worker compiled it); ``wall_s`` the whole evaluation (waiting for
    the worker or verifying, first call, samples).
    """

    strategy: str
    config: dict[str, Any]
    phase: Phase
    status: Status
    time_ms: Optional[float] = None
    screen_ms: Optional[float] = None
    samples: int = 0
    host_ms: Optional[float] = None
    reason: Optional[str] = None
    verified_on: Optional[str] = None
    verified_in: Optional[Literal["worker", "cache"]] = None
    verify_s: float = 0.0
    warmup_s: float = 0.0
    wall_s: float = 0.0

    @property
    def name(self) -> str:
        return candidate_name(self.strategy, self.config)


class TuneResult(BaseModel):
    """Everything one :func:`tune` call measured.

    ``candidates`` holds every evaluated candidate in evaluation order (and, in exhaustive
    mode, those left untimed by ``budget_s``/``max_configs`` as ``skipped``); ``ineligible``
    maps each strategy that could not run to its reasons.  ``timing`` is ``cuda-events`` or
    ``cpu-wall``; ``cpu_wall_time`` repeats that as a flag for the cache.  ``stopped`` says
    why the search ended early (``budget_s`` / ``max_configs``), None when it ran to the end.
    """

    problem: Problem
    mode: Literal["train", "forward"]
    device: DeviceInfo
    timing: timing.TimingKind
    cpu_wall_time: bool
    search: Literal["refine", "exhaustive"]
    winner: Optional[Candidate] = None
    runner_up: Optional[Candidate] = None
    margin: Optional[float] = None
    candidates: list[Candidate] = []
    ineligible: dict[str, list[str]] = {}
    stopped: Optional[str] = None
    elapsed_s: float = 0.0
    measured_at: str = ""

    def ranked(self) -> list[Candidate]:
        """Successful candidates, fastest first."""
        return sorted((c for c in self.candidates if c.status == "ok"),
                      key=lambda c: c.time_ms)

    def failed(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "failed"]

    def summary(self) -> str:
        """A few lines of plain text (the CLI renders its own tables)."""
        unit = "ms (CPU wall time)" if self.cpu_wall_time else "ms"
        lines = [f"{self.problem.key()} on {self.device.signature()}: "
                 f"{len(self.ranked())} ok, {len(self.failed())} failed, "
                 f"{len(self.ineligible)} ineligible strategies, {self.elapsed_s:.1f} s"
                 + (f" (stopped by {self.stopped})" if self.stopped else "")]
        if self.winner is None:
            lines.append("  no winner")
        else:
            host = "" if self.winner.host_ms is None else \
                f" (host {self.winner.host_ms:.3g} ms per call)"
            lines.append(f"  winner    {self.winner.name}: {self.winner.time_ms:.4g} {unit}{host}")
            if self.runner_up is not None:
                lines.append(f"  runner-up {self.runner_up.name}: "
                             f"{self.runner_up.time_ms:.4g} {unit} (+{100 * self.margin:.1f}%)")
        return "\n".join(lines)
