"""Candidates compiled (and verified) ahead of timing, in worker processes.

A tune spends most of its wall time compiling: each candidate's first run compiles its
kernels (Triton: seconds per config), one candidate after the other, while the host's other
cores idle.  :class:`CompilePool` hands that first run to a pool of spawned worker processes.
The tuner submits candidates as soon as it knows them (priors and screen at the start, each
refinement round's configs before the round) and takes them in the same order; a candidate
whose job no worker has started yet is taken back and run by the tuning process itself, so
the pool never makes the tuner wait for a queue or for workers still starting.  "Started" is
a claim: a job's worker and the tuning process each try to create the job's claim file
(``O_EXCL``), and whichever does first runs the candidate; the executor's own state cannot
say, since it marks a job running once it is handed to the workers' queue, before any
worker takes it.

Two modes (``SAMU_TUNE_COMPILE_MODE``):

- ``compile`` (on a GPU, the default): a worker has no CUDA context.  It runs the candidate
  on its verification problem (the op spec's ``verification_problem``: the same kernel
  binaries as the real shape, whose B, L, M are runtime values) on CPU tensors with Triton's
  active driver replaced by one that only names the GPU's target (backend, architecture,
  warp size) and every launch turned into ``warmup`` (compile, no launch): the binaries land
  in Triton's on-disk cache under the keys the tuning process computes for the same launches,
  which then loads them instead of compiling.  The worker's outputs are garbage (nothing
  ran); the tuning process verifies the candidate itself.
- ``verify`` (and on the CPU, under the interpreter): a worker runs the candidate on its
  verification problem on the device against the float64 reference, forward and (training)
  backward; its verdict stands for the tuning process's own verification (same candidate,
  problem, inputs and seed).  These workers share the GPU with the tuning process and are
  stopped before the final interleaved re-timing.

A job that cannot say (the strategy is not registered in a fresh process, e.g. one
registered by a test; the worker failed to start) returns no verdict: the tuning process
verifies that candidate itself, as without a pool.
"""
from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import functools
import hashlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

import torch
from pydantic import BaseModel

from samu_tune.settings import environment

_REFERENCES: dict[Any, Any] = {}     # per worker process: (problem, seed) -> reference
_STEPS: dict[Any, Any] = {}          # per compile worker: (problem, seed) -> timed step
_TARGET: list = []                   # per compile worker: the target it compiles for


def suggested_workers(device: torch.device, processes: int = 1) -> int:
    """A pool size for a tune on ``device`` when ``processes`` tuning processes share the
    host (one per GPU of a distributed ``samu-tune profile``): CUDA: the host's cores less
    one per process, shared out, at most 8 each; the CPU: 0 (the interpreter runs the
    candidates where they are).  ``samu-tune profile`` on a GPU starts this many compile
    workers by default (a cold main job on an H100 host: 0.78-0.86 of its wall time without
    them, docs/performance.md); ``tune()`` starts none unless asked
    (``SAMU_TUNE_COMPILE_WORKERS`` or ``tune(compile_workers=N)``): its workers stay up until
    the process exits, which a training run that tunes online should not pay for."""
    if device.type != "cuda":
        return 0
    processes = max(1, processes)
    return max(0, min(8, (os.cpu_count() or 1) // processes - 1))


def _candidate(op: str, problem: dict, strategy: str, config: dict, info):
    """(op spec, strategy, config, verification problem) of a job's candidate; ``info``: the
    DeviceInfo its eligibility is judged for."""
    from samu_tune import opspec, registry
    prob = opspec.get(op).problem_type.model_validate(problem)
    strat = registry.get(strategy, op)
    cfg = strat.parse_config(config)
    spec = opspec.of(prob)
    return spec, strat, cfg, spec.verification_problem(prob, strat, cfg, info)


def _job(op: str, problem: dict, strategy: str, config: dict, seed: int, device: str
         ) -> tuple[str, Optional[str], float, Optional[str]]:
    """Run one candidate on its verification problem in a worker.

    Returns (status, failure, seconds, verified_on): status ``"verified"`` (failure None: it
    matched the reference; else the reasons, as the tuner's own verification words them) or
    ``"unknown"`` (no verdict: failure says why)."""
    t0 = time.monotonic()
    try:
        from samu_tune.device import device_info
        spec, strat, cfg, vproblem = _candidate(op, problem, strategy, config,
                                                device_info(torch.device(device)))
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
        from samu_tune.evaluate import _reason
        failure = _reason("verification raised", exc)
    return "verified", failure, time.monotonic() - t0, vproblem.key()


def _claim(path: str) -> bool:
    """Claim a job: create ``path`` exclusively.  False: the other side (a worker, or the
    tuning process taking the job back) claimed it first, or the pool is closed (its claims
    directory is gone)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except OSError:
        return False


def _claimed_job(claim: str, job, *args) -> tuple[str, Optional[str], float, Optional[str]]:
    """Run ``job(*args)`` in a worker if this worker claims it first; else ``"unknown"`` at
    once (the tuning process took it back, or its tune is over)."""
    if not _claim(claim):
        return "unknown", "taken back", 0.0, None
    return job(*args)


class _TargetOnly:
    """Triton's active driver in a compile worker: the target to compile for, device 0 and
    stream 0; nothing that needs a GPU (no launch reaches it: every launch is a warmup)."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: Optional[int] = None) -> int:
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def _compile_only(target: tuple) -> None:
    """Make this process compile Triton launches for ``target`` (backend, arch, warp size)
    without running them (once per process)."""
    if _TARGET == [target]:
        return
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    from samu_tune.kernel_device import set_compile_only
    driver.set_active(_TargetOnly(GPUTarget(*target)))
    set_compile_only()          # the ops' kernel paths take CPU tensors from now on
    # kernel[grid](...) compiles (or finds in the disk cache) and returns without launching
    JITFunction.__getitem__ = lambda self, grid: functools.partial(self.run, grid=grid,
                                                                   warmup=True)
    _TARGET[:] = [target]


def _compile_job(op: str, problem: dict, strategy: str, config: dict, seed: int,
                 target: tuple, device: dict) -> tuple[str, Optional[str], float, Optional[str]]:
    """Compile one candidate's kernels for ``target`` in a worker without a GPU: its forward
    and (training) backward on the verification problem for ``device`` (a ``DeviceInfo``
    dump), on CPU tensors, every launch a warmup.

    Returns (status, failure, seconds, verification problem's key): status ``"compiled"``
    (failure: what the run raised, e.g. a compile error; None when it got through) or
    ``"unknown"`` (could not set up: failure says why)."""
    t0 = time.monotonic()
    try:
        _compile_only(target)
        from samu_tune.device import DeviceInfo
        spec, strat, cfg, vproblem = _candidate(op, problem, strategy, config,
                                                DeviceInfo.model_validate(device))
        key = (vproblem, seed)
        if key not in _STEPS:
            _STEPS[key] = spec.make_step(vproblem, "cpu", pool=1, seed=seed)
        step = _STEPS[key]
    except Exception as exc:   # not registered here, cannot set up: the tuner compiles itself
        return "unknown", f"{type(exc).__name__}: {exc}", time.monotonic() - t0, None
    failure = None
    try:
        step(lambda inp: strat.run(inp, cfg), step.pools[0])
    except Exception as exc:   # a compile error, or the garbage outputs upset later host code
        from samu_tune.evaluate import _reason
        failure = _reason("compile run raised", exc)
    return "compiled", failure, time.monotonic() - t0, vproblem.key()


def _compile_target(device: torch.device) -> tuple:
    """(backend, arch, warp size) of the target Triton compiles for on ``device``."""
    from triton.runtime import driver
    with torch.cuda.device(device):
        t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


@contextlib.contextmanager
def _worker_environment(compile_only: bool):
    """The environment spawned workers start with: a compile worker runs no interpreter (its
    kernels must be JIT functions from import on) and launches through Triton (every launch
    is a warmup there)."""
    if not compile_only:
        yield
        return
    with environment(TRITON_INTERPRET="0", SAMU_TUNE_FAST_LAUNCH="0"):
        yield


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


_SHARED: dict[tuple, cf.ProcessPoolExecutor] = {}   # compile workers, kept across tunes


def _shared_executor(workers: int, target: tuple) -> cf.ProcessPoolExecutor:
    """The process's compile workers for ``target`` (spawned on first use, stopped at exit):
    a main job's tunes reuse them instead of paying a worker's start (torch and Triton
    imports) per shape."""
    key = (workers, target)
    if key not in _SHARED:
        if not _SHARED:
            atexit.register(_stop_shared)
        _SHARED[key] = cf.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    return _SHARED[key]


def _stop_shared() -> None:
    for executor in _SHARED.values():
        executor.shutdown(wait=False, cancel_futures=True)
    _SHARED.clear()


class CompilePool:
    """Worker processes compiling (and, in ``verify`` mode, verifying) the candidates of one
    tune (module doc).  ``mode`` None: the settings' ``compile_mode`` on a GPU, ``verify``
    elsewhere; compile mode: ``target`` (backend, arch, warp size) and ``info`` (the
    ``DeviceInfo`` eligibility is judged for), default the device's.

    Counts: ``submitted``; ``finished`` (jobs whose result the tuner took); ``compiled``
    (compile jobs that got through); ``taken_back`` (jobs no worker had started when the
    tuner reached them: it ran those candidates itself)."""

    def __init__(self, problem: BaseModel, device: torch.device, seed: int, workers: int,
                 mode: Optional[str] = None, target: Optional[tuple] = None,
                 info: Optional[BaseModel] = None):
        from samu_tune.device import device_info
        from samu_tune.settings import settings
        self.problem, self.device, self.seed = problem, device, seed
        self.workers = workers
        if mode is None:
            mode = settings().compile_mode if device.type == "cuda" else "verify"
        if mode not in ("compile", "verify"):
            raise ValueError(f"compile pool mode must be 'compile' or 'verify', got {mode!r}")
        self.mode = mode
        self._info = None
        from samu_tune import opspec
        self._ahead = mode == "verify" or opspec.of(problem).compiles_ahead
        if mode == "compile":
            self.target = target or _compile_target(device)
            self._info = (info or device_info(device)).model_dump(mode="json")
            self._pool: Optional[cf.ProcessPoolExecutor] = _shared_executor(workers, self.target)
        else:
            self.target = None
            self._pool = cf.ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        self._jobs: dict[tuple[str, str], cf.Future] = {}
        self._claims = tempfile.mkdtemp(prefix="samu_tune_claims_")
        self.submitted = self.finished = self.compiled = self.taken_back = 0

    @staticmethod
    def key(strategy: str, config: dict) -> tuple[str, str]:
        """A candidate's job key: its strategy and its config's sorted items."""
        return strategy, repr(sorted(config.items()))

    def _claim_path(self, key: tuple[str, str]) -> str:
        """The claim file of job ``key`` (a hash of the key: one name per candidate)."""
        return os.path.join(self._claims, hashlib.sha1(repr(key).encode()).hexdigest())

    def submit(self, strategy: str, config: dict) -> None:
        """Hand a candidate to the workers (compile mode: only an op whose spec
        ``compiles_ahead``)."""
        key = self.key(strategy, config)
        if self._pool is None or key in self._jobs or not self._ahead:
            return
        problem = self.problem.model_dump(mode="json")
        claim = self._claim_path(key)
        try:
            # the pool starts its workers inside submit
            with _main_hidden(), _worker_environment(self.mode == "compile"):
                if self.mode == "compile":
                    job = self._pool.submit(_claimed_job, claim, _compile_job, self.problem.op,
                                            problem, strategy, config, self.seed, self.target,
                                            self._info)
                else:
                    job = self._pool.submit(_claimed_job, claim, _job, self.problem.op,
                                            problem, strategy, config, self.seed,
                                            str(self.device))
            self._jobs[key] = job
            self.submitted += 1
        except Exception:      # a broken pool: the tuner verifies the rest itself
            self.close()

    def verdict(self, strategy: str, config: dict) -> Optional[Verdict]:
        """The verdict of a submitted candidate, or None: not submitted, taken back (no
        worker had started it), no verdict (compile mode: the kernels are compiled, the
        tuning process verifies), or the pool is gone.  Waits for a job a worker runs."""
        key = self.key(strategy, config)
        job = self._jobs.get(key)
        if job is None:
            return None
        if job.cancel() or (not job.done() and _claim(self._claim_path(key))):
            self.taken_back += 1
            return None
        try:
            status, failure, seconds, verified_on = job.result()
        except Exception:       # the worker died (BrokenProcessPool) or the job was cancelled
            return None
        self.finished += 1
        if status == "compiled":
            self.compiled += failure is None
            return None
        if status != "verified":
            return None
        return Verdict(failure=failure, seconds=seconds, verified_on=verified_on)

    def close(self) -> None:
        """Drop this tune's queued jobs.  Verify mode: stop the workers now (running jobs
        killed): the GPU is the tuning process's alone afterwards.  Compile mode: the workers
        stay for the next tune (they do not touch the GPU)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for job in self._jobs.values():
            job.cancel()
        # a job already handed to the workers' queue finds no claims directory: it returns
        # at once instead of compiling for a tune that is over
        shutil.rmtree(self._claims, ignore_errors=True)
        if self.mode == "compile":
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
