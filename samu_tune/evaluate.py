"""The tuner's evaluation of candidates (:class:`Search`): verify each (strategy, config) on its
op's verification problem (here or by a compile-pool worker), time it at the real shape, keep
every result, stop at the budget, and re-time the best interleaved.  The order in which
candidates are asked for is the tuner's (:mod:`samu_tune.tuner`).

With ``patience``, the search also stops ("converged") after that many refinement candidates
in a row none of which beat the best time so far by more than ``min_gain``: on the H200 the
searches that start from the known winners of nearby shapes find their pick among the first
candidates (docs/performance.md), and each further candidate costs a compile and a
verification (about a second cold).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

import torch
from pydantic import BaseModel

from samu_tune import opspec, timing, verified
from samu_tune.device import DeviceInfo
from samu_tune.problem import Problem
from samu_tune.registry import Strategy
from samu_tune.results import Candidate, Phase, ProgressFn, TuneEvent, candidate_name, config_json


# a refinement candidate "improves" when it beats the best time so far by more than this
MIN_GAIN = 0.01


def _reason(where: str, exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return f"{where}: {type(exc).__name__}: {first}" if first else f"{where}: {type(exc).__name__}"


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class Search:
    """State of one tune() call: memo of evaluated candidates, budget, progress."""

    def __init__(self, problem: Problem, dev: DeviceInfo, torch_device: torch.device, *,
                 seed: int, budget_s: Optional[float], max_configs: Optional[int],
                 reps: Optional[int], progress: Optional[ProgressFn],
                 max_workspace_bytes: Optional[int], pool=None,
                 patience: Optional[int] = None, min_gain: float = MIN_GAIN):
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
        # convergence: refinement candidates since the best time last fell by > min_gain
        self.patience, self.min_gain = patience, min_gain
        self.best_ms = math.inf
        self.stale = 0

    # -- bookkeeping ------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def exhausted(self) -> Optional[str]:
        if self.max_configs is not None and len(self.order) >= self.max_configs:
            return "max_configs"
        if self.budget_s is not None and self.elapsed() >= self.budget_s and self.order:
            return "budget_s"
        if self.patience is not None and self.stale >= self.patience:
            return "converged"
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
        self._track(cand, phase)
        self.emit(event="finish", phase=phase, candidate=name, strategy=strategy.name,
                  config=cfg, index=index, total=total, status=cand.status,
                  time_ms=cand.time_ms, reason=cand.reason)
        return cand

    def _track(self, cand: Candidate, phase: Phase) -> None:
        """Count the refinement candidates that do not beat the best time so far by more than
        ``min_gain`` (a failed one counts too); priors and screens never count."""
        t = cand.time_ms if cand.status == "ok" and cand.time_ms is not None else math.inf
        if t < self.best_ms * (1.0 - self.min_gain):
            self.stale = 0
        elif phase == "refine":
            self.stale += 1
        self.best_ms = min(self.best_ms, t)

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
        verdict = (self.pool.verdict(strategy.name, config_json(config))
                   if self.pool is not None else None)
        if verdict is not None:
            cand.verified_on, cand.verify_s = verdict.verified_on, verdict.seconds
            cand.verified_in = "worker"
            if verdict.failure is not None:
                cand.reason = verdict.failure
                return cand
            stored = self._verification_key(strategy, config, verdict.verified_on)
            if stored is not None:
                verified.record_pass(self.dev.signature(), stored, verdict.seconds)
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
        stored = self._verification_key(strategy, config, vproblem.key())
        if stored is not None and verified.passed(self.dev.signature(), stored) is not None:
            cand.verified_in = "cache"
            return None
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
        if failure is None and stored is not None:
            verified.record_pass(self.dev.signature(), stored, cand.verify_s)
        return failure

    def _verification_key(self, strategy: Strategy, config: BaseModel,
                          problem_key: Optional[str]) -> Optional[str]:
        """The verification's key in :mod:`samu_tune.verified`; None (never read or stored)
        without a problem key, or for a strategy that lists no modules: no code identity."""
        if problem_key is None or not strategy.modules:
            return None
        return verified.key(self.problem.op, strategy.key, strategy.source_hash,
                            config_json(config), problem_key, self.seed)

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
