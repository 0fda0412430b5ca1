"""The tuner: eligible (strategy, config) candidates -> verify -> time -> :class:`TuneResult`.

Pipeline of :func:`tune`:

1. **Eligibility.**  Every registered strategy's capability is checked against the problem
   and device first (no compile happens for an ineligible one); its reasons are kept in
   ``TuneResult.ineligible``.  In deterministic mode (``problem.deterministic``, set when
   ``torch.are_deterministic_algorithms_enabled()``) strategies using float atomics drop out
   here.  The config space of each eligible strategy is ``Strategy.configs(problem)``.
2. **Verification.**  Each candidate is run once on random inputs and compared, forward and
   (in train mode) every gradient, with the float64 reference (:func:`samu_tune.verify.verify`).
   *Choice:* verification runs on a small problem with the same features and dtypes, not on the
   real shape -- the float64 reference is a Python loop over L and would dominate tuning time
   at real shapes, while kernels take B, L, M as runtime values so the compiled binary is the
   same.  The small problem keeps ``B <= 2``; ``L`` is kept when ``<= 320`` else becomes
   ``256 + L % 64`` (same tail modulo every chunk size up to 64); ``M`` is kept when ``<= 64``
   else becomes ``64`` when ``M % 32 == 0``, else ``32 + M % 32`` (same tail modulo 32).  When
   the candidate's config is not valid for (or its strategy not eligible at) that shape, the
   real M, then the real L, then the real shape are used instead.  The timing run at the real
   shape also checks that the outputs are finite.
3. **Timing** at the real shape (:mod:`samu_tune.timing`): one warm-up call (it pays the
   compile, reported as ``warmup_s``), then the median of repeated samples on a pool of fresh
   inputs -- on CUDA the GPU time alone (device events with the L2 flushed, each sample queued
   behind a GPU busy-wait so the host's launch time never shows; the host time per call is
   kept as ``host_ms``), wall time on the CPU (marked ``cpu_wall_time``).  Train mode times
   forward + backward of every input.
4. **Search.**  Not every config is timed.  First the *priors*: the winners of the nearest
   tuned problems with the same features (user cache, then the shipped table of this device,
   nearest in log-space of (B*M, L) first; at most ``prior_top`` distinct candidates that can
   run this problem) -- what was fast at a neighbouring shape is the best first guess, and it
   is timed before anything else in case the budget runs out (on a cold compile cache the
   screening alone can exceed a few seconds).  Then each eligible strategy's default config
   is screened, then the best ``refine_top`` strategies are refined by coordinate descent (one
   config field at a time, from the strategy's best config so far, until no field improves).
   ``budget_s`` stops starting new candidates once exceeded, ``max_configs`` caps how many are
   evaluated; ``exhaustive=True`` evaluates the whole space instead (to measure how close the
   search gets).
5. **Re-timing.**  The best ``retime_top`` candidates are re-timed interleaved (round robin)
   and their final time is the median of those samples; the winner is the fastest and
   ``margin`` is ``runner_up.time_ms / winner.time_ms - 1``.

Ops.  The pipeline is the same for every op (:mod:`samu_tune.opspec`): the problem's op names
its strategies (``registry.eligible``) and its :class:`~samu_tune.opspec.OpSpec` gives the
random inputs, the float64 reference and the comparison, the verification problem (the scan's
is described in 2.; the decode step's keeps B <= 2) and the timed call (the decode step is
forward only).  ``mode`` and determinism apply to ops whose problem has those fields.

A candidate that fails to compile, runs out of resources or memory, raises, or disagrees with
the reference is recorded with status ``failed`` and its reason, never wins, and tuning goes on.
Caveat on CUDA: an illegal memory access poisons the CUDA context, so every later candidate
then fails too; the reason names the first failure.
"""
from __future__ import annotations

import datetime as _dt
import math
import time
from typing import Any, Callable, Literal, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict

from . import opspec, registry, timing
from .device import DeviceInfo, device_info
from .problem import Problem, ScanProblem  # noqa: F401  (ScanProblem: re-export)
from .registry import Strategy
from .scan_op import verification_problem  # noqa: F401  (public here since before ops)

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
    ``verify_s``; None: the tuning process); ``warmup_s`` the first call at the real shape
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
    verified_in: Optional[Literal["worker"]] = None
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


def _reason(where: str, exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return f"{where}: {type(exc).__name__}: {first}" if first else f"{where}: {type(exc).__name__}"


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class _Search:
    """State of one tune() call: memo of evaluated candidates, budget, progress."""

    def __init__(self, problem: Problem, dev: DeviceInfo, torch_device: torch.device, *,
                 seed: int, budget_s: Optional[float], max_configs: Optional[int],
                 reps: Optional[int], progress: Optional[ProgressFn],
                 max_workspace_bytes: Optional[int], pool=None):
        self.problem, self.dev, self.device = problem, dev, torch_device
        self.pool = pool     # CompilePool: candidates compiled and verified ahead, or None
        self.spec = opspec.of(problem)
        self.seed, self.budget_s, self.max_configs, self.reps = seed, budget_s, max_configs, reps
        self.progress = progress
        self.max_workspace_bytes = max_workspace_bytes
        self.t0 = time.monotonic()
        self.done: dict[tuple[str, str], Candidate] = {}
        self.order: list[Candidate] = []
        self.stopped: Optional[str] = None
        self._verify_inputs: dict[Problem, tuple[Any, Any]] = {}  # inputs, reference result
        self._step: Optional[timing.PoolStep] = None
        self._fns: dict[tuple[str, str], Callable] = {}

    # -- bookkeeping ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def exhausted(self) -> Optional[str]:
        if self.max_configs is not None and len(self.order) >= self.max_configs:
            return "max_configs"
        if self.budget_s is not None and self.elapsed() >= self.budget_s and self.order:
            return "budget_s"
        return None

    def left(self) -> Optional[int]:
        return None if self.max_configs is None else self.max_configs - len(self.order)

    def emit(self, **kw) -> None:
        if self.progress is not None:
            self.progress(TuneEvent(elapsed_s=self.elapsed(), **kw))

    @staticmethod
    def key(strategy: Strategy, config: BaseModel) -> tuple[str, str]:
        return strategy.name, repr(sorted(config_json(config).items()))

    def prefetch(self, items: list[tuple[Strategy, BaseModel]]) -> None:
        """Hand the candidates the search is about to evaluate to the compile pool."""
        if self.pool is None:
            return
        for strategy, config in items:
            if self.key(strategy, config) not in self.done:
                self.pool.submit(strategy.name, config_json(config))

    # -- one candidate ----------------------------------------------------------------------
    def evaluate(self, strategy: Strategy, config: BaseModel, phase: Phase, index: int,
                 total: int) -> Optional[Candidate]:
        """The candidate's result (memoized); None when the budget or cap stops the search."""
        key = self.key(strategy, config)
        if key in self.done:
            return self.done[key]
        stop = self.exhausted()
        if stop:
            self.stopped = self.stopped or stop
            return None
        name = candidate_name(strategy.name, config)
        cfg = config_json(config)
        self.emit(event="start", phase=phase, candidate=name, strategy=strategy.name,
                  config=cfg, index=index, total=total)
        t0 = time.monotonic()
        cand = self._evaluate(strategy, config, phase)
        cand.wall_s = time.monotonic() - t0
        self.done[key] = cand
        self.order.append(cand)
        self.emit(event="finish", phase=phase, candidate=name, strategy=strategy.name,
                  config=cfg, index=index, total=total, status=cand.status,
                  time_ms=cand.time_ms, reason=cand.reason)
        return cand

    def _evaluate(self, strategy: Strategy, config: BaseModel, phase: Phase) -> Candidate:
        cand = Candidate(strategy=strategy.name, config=config_json(config), phase=phase,
                         status="failed")
        problem = self.problem
        if self.max_workspace_bytes is not None:
            need = int(strategy.workspace_bytes(problem, config))
            if need > self.max_workspace_bytes:
                cand.status = "skipped"
                cand.reason = (f"workspace {need / 2**30:.2f} GiB > budget "
                               f"{self.max_workspace_bytes / 2**30:.2f} GiB")
                return cand

        def fn(inputs):
            return strategy.run(inputs, config)

        # verification on a small problem against the float64 reference: a compile-pool
        # worker's verdict, else here
        spec = self.spec
        verdict = (self.pool.verdict(strategy.name, config_json(config))
                   if self.pool is not None else None)
        if verdict is not None:
            cand.verified_on, cand.verify_s = verdict.verified_on, verdict.seconds
            cand.verified_in = "worker"
            if verdict.failure is not None:
                cand.reason = verdict.failure
                return cand
        else:
            failure = self._verify(strategy, config, fn, cand)
            if failure is not None:
                cand.reason = failure if failure.startswith("verification raised") \
                    else f"wrong result: {failure}"
                return cand
        return self._time(strategy, config, fn, cand)

    def _verify(self, strategy: Strategy, config: BaseModel, fn, cand: Candidate
                ) -> Optional[str]:
        spec = self.spec
        vproblem = spec.verification_problem(self.problem, strategy, config, self.dev)
        cand.verified_on = vproblem.key()
        t = time.monotonic()
        try:
            if vproblem not in self._verify_inputs:
                inputs = spec.random_inputs(vproblem, seed=self.seed, device=str(self.device))
                self._verify_inputs[vproblem] = (
                    inputs, spec.expected(inputs, vproblem, seed=self.seed))
            inputs, reference = self._verify_inputs[vproblem]
            failure = spec.verify(fn, inputs, vproblem, seed=self.seed, reference=reference)
        except Exception as exc:  # compile error, out of resources, anything the strategy raises
            failure = _reason("verification raised", exc)
            self._recover(exc)
        cand.verify_s = time.monotonic() - t
        return failure

    def _time(self, strategy: Strategy, config: BaseModel, fn, cand: Candidate) -> Candidate:
        """Time a verified candidate at the real shape."""
        problem = self.problem
        try:
            step = self.step()
            t = time.monotonic()
            out = step(fn, step.next_inputs())
            timing.sync(self.device)
            cand.warmup_s = time.monotonic() - t
            if out is not None and not self.spec.finite(out):
                cand.reason = f"non-finite output at the real shape {problem.key()}"
                return cand
            first = timing.sample(step, fn, 1)
            n = self.reps if self.reps is not None else timing.reps_for(first[0], device=self.device)
            samples = first + (timing.sample(step, fn, n - 1) if n > 1 else [])
        except Exception as exc:
            cand.reason = _reason("timing raised", exc)
            self._recover(exc)
            return cand
        cand.status = "ok"
        cand.time_ms = cand.screen_ms = timing.median(samples)
        cand.samples = len(samples)
        cand.host_ms = timing.host_ms(step, fn)
        self._fns[self.key(strategy, config)] = fn
        return cand

    def _recover(self, exc: BaseException) -> None:
        if self.device.type == "cuda" and _out_of_memory(exc):
            torch.cuda.empty_cache()

    def step(self) -> timing.PoolStep:
        if self._step is None:
            pool = 2
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                if 3 * self.spec.input_bytes(self.problem) > free // 2:
                    pool = 1
            self._step = self.spec.make_step(self.problem, self.device, pool=pool,
                                             seed=self.seed + 1000)
        return self._step

    # -- interleaved re-timing ----------------------------------------------------------------
    def retime(self, top: list[Candidate], rounds: Optional[int]) -> None:
        if len(top) < 2:
            return
        fns = [self._fns[(c.strategy, repr(sorted(c.config.items())))] for c in top]
        if rounds is None:
            rounds = timing.reps_for(min(c.time_ms for c in top) * len(top), device=self.device)
        samples: list[list[float]] = [[] for _ in top]
        failed: dict[int, str] = {}
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                if i in failed:
                    continue
                try:
                    samples[i] += timing.sample(self.step(), fn, 1)
                except Exception as exc:
                    failed[i] = _reason("re-timing raised", exc)
                    self._recover(exc)
        for i, cand in enumerate(top):
            if i in failed:
                cand.status, cand.reason, cand.time_ms = "failed", failed[i], None
            elif samples[i]:
                cand.time_ms = timing.median(samples[i])
                cand.samples += len(samples[i])
                cand.host_ms = timing.host_ms(self.step(), fns[i])
            self.emit(event="finish", phase="retime", candidate=cand.name,
                      strategy=cand.strategy, config=cand.config, index=i + 1, total=len(top),
                      status=cand.status, time_ms=cand.time_ms, reason=cand.reason)


def _coordinate_descent(search: _Search, strategy: Strategy, start: BaseModel,
                        space: list[BaseModel]) -> None:
    """Improve ``start`` one config field at a time until no field improves; then try every
    config two fields away from the best (fields interact: a look-back config two fields away
    can win where each one-field step loses, docs/performance.md) and, when one is faster,
    descend again from it."""
    fields = list(strategy.config_model.model_fields)
    best = start

    def time_of(cfg):
        c = search.done.get(search.key(strategy, cfg))
        return c.time_ms if c is not None and c.status == "ok" else math.inf

    def differ(cfg) -> int:
        return sum(getattr(cfg, f) != getattr(best, f) for f in fields)

    def evaluate_all(configs: list[BaseModel]) -> bool:
        todo = [c for c in configs if search.key(strategy, c) not in search.done]
        search.prefetch([(strategy, c) for c in todo])
        for i, cfg in enumerate(todo):
            left = search.left()
            total = len(todo) if left is None else min(len(todo), i + left)
            if search.evaluate(strategy, cfg, "refine", i + 1, max(total, i + 1)) is None:
                return False
        return True

    while True:
        improved = True
        while improved:
            improved = False
            for field in fields:
                others = [f for f in fields if f != field]
                line = [c for c in space
                        if all(getattr(c, f) == getattr(best, f) for f in others)]
                if not evaluate_all([c for c in line if c != best]):
                    return
                new_best = min(line, key=time_of, default=best)
                if time_of(new_best) < time_of(best):
                    best, improved = new_best, True
        pairs = [c for c in space if differ(c) == 2]
        if not evaluate_all(pairs):
            return
        new_best = min(pairs, key=time_of, default=best)
        if not time_of(new_best) < time_of(best):
            return
        best = new_best


def tune(problem: Problem, mode: Optional[Literal["train", "forward"]] = None, *,
         strategies: Optional[Sequence[str]] = None, exhaustive: bool = False,
         budget_s: Optional[float] = None, max_configs: Optional[int] = None,
         prior_top: int = 5, refine_top: int = 2, retime_top: int = 3, retime_rounds: Optional[int] = None,
         reps: Optional[int] = None, seed: int = 0, progress: Optional[ProgressFn] = None,
         device: torch.device | str | None = None, max_workspace_bytes: Optional[int] = None,
         save: bool = False, compile_workers: Optional[int] = None) -> TuneResult:
    """Find the fastest correct (strategy, config) for ``problem`` (a :class:`ScanProblem`, a
    :class:`DecodeProblem`: any op with a spec in :mod:`samu_tune.opspec`).

    ``mode`` ("train" = forward + backward, "forward") overrides ``problem.backward`` (the
    result's problem has ``backward == (mode == "train")``).  When torch's deterministic mode
    is on, the problem is tuned as deterministic.  ``strategies`` restricts the candidates to
    those names.  ``budget_s``: no new candidate starts after this many seconds (at least one
    is evaluated); ``max_configs``: at most this many candidates are evaluated (verified and
    timed).  ``exhaustive``: evaluate every valid config of every eligible strategy instead of
    timing ``prior_top`` winners of neighbouring tuned problems, screening defaults and
    refining the best ``refine_top`` strategies.  ``retime_top``
    candidates are re-timed interleaved for ``retime_rounds`` rounds (auto when None);
    ``reps`` fixes the samples per candidate (auto when None).  ``progress(TuneEvent)`` is
    called at each candidate's start and finish.  ``device``: the CUDA device (default: the
    current one) for a CUDA problem.  ``max_workspace_bytes`` skips candidates needing more
    workspace (default on CUDA: half the free memory).  ``save`` stores the winner in the cache.
    ``compile_workers``: processes compiling and verifying candidates ahead of timing
    (:mod:`samu_tune.compile_pool`; default ``SAMU_TUNE_COMPILE_WORKERS``, else none;
    :func:`samu_tune.compile_pool.suggested_workers` gives a size for a machine).
    """
    fields = type(problem).model_fields
    if mode is not None:
        if mode not in ("train", "forward"):
            raise ValueError(f"mode must be 'train' or 'forward', got {mode!r}")
        if "backward" in fields:
            problem = problem.model_copy(update={"backward": mode == "train"})
        elif mode != problem.mode:
            raise ValueError(f"the {problem.op} op is {problem.mode} only; cannot tune it in "
                             f"mode {mode!r}")
    if (torch.are_deterministic_algorithms_enabled() and "deterministic" in fields
            and not problem.deterministic):
        problem = problem.model_copy(update={"deterministic": True})
    if problem.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"cannot tune {problem.key()} for cuda: no CUDA device")
        torch_device = torch.device(device if device is not None else "cuda")
        if torch_device.index is None:
            torch_device = torch.device("cuda", torch.cuda.current_device())
        if max_workspace_bytes is None:
            max_workspace_bytes = torch.cuda.mem_get_info(torch_device)[0] // 2
    else:
        torch_device = torch.device("cpu")
    if max_configs is not None and max_configs < 1:
        raise ValueError(f"max_configs must be >= 1, got {max_configs}")
    dev = device_info(torch_device)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    pairs = registry.eligible(problem, dev, names=strategies)
    ineligible = {s.name: r for s, r in pairs if r}
    runnable = [s for s, r in pairs if not r]
    spaces = {s.name: s.configs(problem) for s in runnable}
    skipped: list[Candidate] = []
    search = _Search(problem, dev, torch_device, seed=seed, budget_s=budget_s,
                     max_configs=max_configs, reps=reps, progress=progress,
                     max_workspace_bytes=max_workspace_bytes,
                     pool=_compile_pool(problem, torch_device, seed, compile_workers,
                                        sum(len(v) for v in spaces.values())))
    try:
        _search(search, problem, dev, runnable, spaces, skipped, exhaustive=exhaustive,
                prior_top=prior_top, refine_top=refine_top)
    finally:
        if search.pool is not None:
            search.pool.close()

    ranked = sorted((c for c in search.order if c.status == "ok"), key=lambda c: c.time_ms)
    search.retime(ranked[:max(0, retime_top)], retime_rounds)
    ranked = sorted((c for c in search.order if c.status == "ok"), key=lambda c: c.time_ms)
    winner = ranked[0] if ranked else None
    runner_up = ranked[1] if len(ranked) > 1 else None
    margin = (runner_up.time_ms / winner.time_ms - 1.0) if runner_up and winner.time_ms > 0 \
        else None
    kind = timing.timing_kind(problem)
    result = TuneResult(
        problem=problem, mode=problem.mode, device=dev, timing=kind,
        cpu_wall_time=kind == "cpu-wall", search="exhaustive" if exhaustive else "refine",
        winner=winner, runner_up=runner_up, margin=margin,
        candidates=search.order + skipped, ineligible=ineligible, stopped=search.stopped,
        elapsed_s=search.elapsed(), measured_at=started)
    if save and winner is not None:
        from . import cache
        cache.record(result)
    return result


def _compile_pool(problem: Problem, device: torch.device, seed: int,
                  workers: Optional[int], candidates: int):
    """The tune's :class:`~samu_tune.compile_pool.CompilePool`, or None (no workers asked
    for, a single candidate, or the pool cannot start)."""
    from . import compile_pool
    from .settings import settings
    if workers is None:
        workers = settings().compile_workers or 0
    workers = min(workers, candidates)
    if workers < 1 or candidates < 2:
        return None
    try:
        return compile_pool.CompilePool(problem, device, seed, workers)
    except Exception:     # no process pool here: compile in the tuning process
        return None


def _search(search: _Search, problem: Problem, dev: DeviceInfo, runnable: list[Strategy],
            spaces: dict[str, list[BaseModel]], skipped: list[Candidate], *, exhaustive: bool,
            prior_top: int, refine_top: int) -> None:
    """The candidates of a tune, evaluated into ``search`` (see :func:`tune`)."""
    if exhaustive:
        plan = [(s, c) for s in runnable for c in _default_first(s, spaces[s.name], problem)]
        search.prefetch(plan)
        for i, (s, cfg) in enumerate(plan):
            if search.evaluate(s, cfg, "exhaustive", i + 1, len(plan)) is None:
                skipped += [Candidate(strategy=s2.name, config=config_json(c2),
                                      phase="exhaustive", status="skipped",
                                      reason=f"not timed: {search.stopped} reached")
                            for s2, c2 in plan[i:]]
                break
    else:
        priors = _priors(problem, dev, runnable, spaces, prior_top)
        main = [s for s in runnable if s.priority >= 0]
        search.prefetch(priors + [(s, c) for s in main
                                  for c in _default_first(s, spaces[s.name], problem)[:1]])
        for i, (s, cfg) in enumerate(priors):
            if search.evaluate(s, cfg, "prior", i + 1, len(priors)) is None:
                break
        # fallbacks (negative priority: the torch reference) only when nothing else ran; the
        # float64 reference costs seconds per call at real shapes
        fallbacks = [s for s in runnable if s.priority < 0]
        for i, s in enumerate(main + fallbacks):
            if search.stopped:
                break
            if s.priority < 0 and any(c.status == "ok" for c in search.order):
                continue
            ordered = _default_first(s, spaces[s.name], problem)
            # a strategy whose default fails gets one more try with its next config
            for cfg in ordered[:2]:
                cand = search.evaluate(s, cfg, "screen", i + 1, len(main + fallbacks))
                if cand is None or cand.status == "ok":
                    break
            if cand is None:
                break
        for s, cfg in _best_per_strategy(search, runnable)[:max(0, refine_top)]:
            if search.stopped:
                break
            _coordinate_descent(search, s, cfg, spaces[s.name])


def _priors(problem: Problem, dev: DeviceInfo, runnable: list[Strategy],
            spaces: dict[str, list[BaseModel]], limit: int) -> list[tuple[Strategy, BaseModel]]:
    """Up to ``limit`` distinct (strategy, config) winners of the nearest tuned problems with
    the same features (the exact key included: re-tuning starts from the old winner), from the
    user cache then the shipped table; only those this problem's search space holds."""
    if limit <= 0:
        return []
    from . import cache
    by_name = {s.name: s for s in runnable}
    sig = dev.signature()
    found: list[tuple[float, int, Strategy, BaseModel]] = []
    for rank, shipped in enumerate((False, True)):
        try:
            near = cache.nearest(problem, sig, shipped=shipped, include_exact=True)
        except Exception:  # an unreadable table never stops tuning
            continue
        for dist, entry in near:
            strat = by_name.get(entry.strategy)
            if strat is None:
                continue
            try:
                cfg = strat.parse_config(entry.config)
            except (ValueError, TypeError):
                continue
            if cfg in spaces[strat.name]:
                found.append((dist, rank, strat, cfg))
    found.sort(key=lambda item: (item[0], item[1]))
    out: list[tuple[Strategy, BaseModel]] = []
    for _, _, strat, cfg in found:
        if not any(strat is s and cfg == c for s, c in out):
            out.append((strat, cfg))
        if len(out) >= limit:
            break
    return out


def _best_per_strategy(search: _Search, runnable: list[Strategy]
                       ) -> list[tuple[Strategy, BaseModel]]:
    """Each strategy with an ok candidate and its fastest config so far, fastest first."""
    best: dict[str, tuple[float, Strategy, BaseModel]] = {}
    by_name = {s.name: s for s in runnable}
    for cand in search.order:
        strat = by_name.get(cand.strategy)
        if cand.status != "ok" or strat is None:
            continue
        if cand.strategy not in best or cand.time_ms < best[cand.strategy][0]:
            best[cand.strategy] = (cand.time_ms, strat, strat.parse_config(cand.config))
    return [(s, c) for _, s, c in sorted(best.values(), key=lambda item: item[0])]


def _default_first(strategy: Strategy, space: list[BaseModel], problem: Problem
                   ) -> list[BaseModel]:
    """The config space with the strategy's default (when valid) first."""
    try:
        default = strategy.default_config(problem)
    except Exception:
        return list(space)
    if default in space:
        return [default] + [c for c in space if c != default]
    return list(space)
