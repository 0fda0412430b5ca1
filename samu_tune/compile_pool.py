"""Candidates compiled and verified ahead of timing, in worker processes.

A tune spends most of its wall time compiling: each candidate's first run compiles its
kernels (Triton: seconds per config), one candidate after the other, while the host's other
cores idle.  :class:`CompilePool` runs that first run in a pool of spawned worker processes:
a job runs the candidate on its verification problem (the op spec's
``verification_problem``: the same kernel binaries as the real shape, whose B, L, M are
runtime values) against the float64 reference, forward and (training) backward.  The
binaries land in Triton's on-disk cache, which the tuning process then loads instead of
compiling; the job's verdict stands for the tuning process's own verification (same
candidate, problem, inputs and seed).  The tuner submits candidates as soon as it knows them
(priors and screen at the start, each refinement round's configs before the round) and
times them one at a time as their jobs finish.

A job that cannot say (the strategy is not registered in a fresh process, e.g. one
registered by a test; the worker failed to start) returns no verdict: the tuning process
verifies that candidate itself, as without a pool.  The workers share the GPU with the
tuning process: their runs are small (the verification problem), and the pool is stopped
before the final interleaved re-timing.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import sys
import time
from typing import Any, Optional

import torch
from pydantic import BaseModel

_REFERENCES: dict[Any, Any] = {}     # per worker process: (problem, seed) -> reference


def suggested_workers(device: torch.device) -> int:
    """A pool size for a tune on ``device``: CUDA: the host's cores less one, at most 8 (each
    worker holds a CUDA context); the CPU: 0 (the interpreter runs the candidates where they
    are).  The pool is opt-in (``SAMU_TUNE_COMPILE_WORKERS`` or ``tune(compile_workers=N)``);
    ``python -m benchmarks.bench_cold_tune`` measures a cold tune with and without it."""
    if device.type != "cuda":
        return 0
    return max(0, min(8, (os.cpu_count() or 1) - 1))


def _job(op: str, problem: dict, strategy: str, config: dict, seed: int, device: str
         ) -> tuple[str, Optional[str], float, Optional[str]]:
    """Run one candidate on its verification problem in a worker.

    Returns (status, failure, seconds, verified_on): status ``"verified"`` (failure None: it
    matched the reference; else the reasons, as the tuner's own verification words them) or
    ``"unknown"`` (no verdict: failure says why)."""
    t0 = time.monotonic()
    try:
        from samu_tune import opspec, registry
        from samu_tune.device import device_info
        prob = opspec.get(op).problem_type.model_validate(problem)
        strat = registry.get(strategy, op)
        cfg = strat.parse_config(config)
        spec = opspec.of(prob)
        vproblem = spec.verification_problem(prob, strat, cfg, device_info(torch.device(device)))
        key = (vproblem, seed)
        if key not in _REFERENCES:
            inputs = spec.random_inputs(vproblem, seed=seed, device=device)
            _REFERENCES[key] = (inputs, spec.expected(inputs, vproblem, seed=seed))
        inputs, reference = _REFERENCES[key]
    except Exception as exc:   # not registered here, cannot set up: the tuner verifies itself
        return "unknown", f"{type(exc).__name__}: {exc}", time.monotonic() - t0, None
    try:
        failure = spec.verify(lambda inp: strat.run(inp, cfg), inputs, vproblem, seed=seed,
                              reference=reference)
        if failure is not None:
            failure = f"wrong result: {failure}"
    except Exception as exc:   # compile error, out of resources, anything the strategy raises
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        failure = f"verification raised {type(exc).__name__}: {first}"
    return "verified", failure, time.monotonic() - t0, vproblem.key()


@contextlib.contextmanager
def _main_hidden():
    """Spawned workers run nothing of the caller's ``__main__``: a spawned process imports
    the parent's main module (by name, or its file) before it runs a job, which re-runs an
    unguarded training script's top level in every worker.  The jobs need only this module."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None
             and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


class Verdict(BaseModel):
    """A worker's verdict on one candidate (``failure`` None: verified)."""

    failure: Optional[str] = None
    seconds: float = 0.0
    verified_on: Optional[str] = None


class CompilePool:
    """Worker processes compiling and verifying the candidates of one tune (module doc)."""

    def __init__(self, problem: BaseModel, device: torch.device, seed: int, workers: int):
        self.problem, self.device, self.seed = problem, device, seed
        self.workers = workers
        self._pool: Optional[cf.ProcessPoolExecutor] = cf.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        self._jobs: dict[tuple[str, str], cf.Future] = {}
        self.submitted = self.finished = 0

    def submit(self, strategy: str, config: dict) -> None:
        key = (strategy, repr(sorted(config.items())))
        if self._pool is None or key in self._jobs:
            return
        try:
            with _main_hidden():      # the pool starts its workers inside submit
                self._jobs[key] = self._pool.submit(
                    _job, self.problem.op, self.problem.model_dump(mode="json"), strategy,
                    config, self.seed, str(self.device))
            self.submitted += 1
        except Exception:      # a broken pool: the tuner verifies the rest itself
            self.close()

    def verdict(self, strategy: str, config: dict) -> Optional[Verdict]:
        """The verdict of a submitted candidate (waits for its job), or None: not submitted,
        no verdict, or the pool is gone."""
        job = self._jobs.get((strategy, repr(sorted(config.items()))))
        if job is None:
            return None
        try:
            status, failure, seconds, verified_on = job.result()
        except Exception:       # the worker died (BrokenProcessPool) or the job was cancelled
            return None
        self.finished += 1
        if status != "verified":
            return None
        return Verdict(failure=failure, seconds=seconds, verified_on=verified_on)

    def close(self) -> None:
        """Stop the workers now (queued jobs are dropped, running ones killed): the GPU is the
        tuning process's alone afterwards."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            try:
                p.terminate()
            except Exception:
                pass
        for p in processes:
            try:
                p.join(timeout=5)
            except Exception:
                pass
