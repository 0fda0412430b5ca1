"""Environment read once: every ``SAMU_TUNE_*`` variable lands in one pydantic model.

Nothing else in the package reads a setting from ``os.environ`` (the CLI only hands the
environment on to a child process, and lets ``COLUMNS`` size its console as rich does).  Tests
that change the environment call :func:`reload_settings`.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

_PREFIX = "SAMU_TUNE_"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    mode: Literal["cached", "online", "off"] = Field(
        "cached", description="dispatch policy: cached lookup, tune on miss, or rules only")
    cache_dir: Optional[Path] = Field(
        None, description="directory of the winner cache (default: platformdirs user cache)")
    check_finite: bool = Field(
        False, description="also check that the spectrum is finite (one device sync per call)")
    tune_budget_s: float = Field(
        25.0, gt=0, description="time budget of one online tuning (a new shape tunes in < 30 s)")
    tune_patience: int = Field(
        6, ge=1, description="a tuning's search stops after this many refinement candidates in "
        "a row without a gain of more than 1% (profile --exhaustive times everything)")
    compile_workers: Optional[int] = Field(
        None, ge=0, description="worker processes compiling and verifying tuning candidates "
        "ahead of timing (default: none for tune(); samu-tune profile on a GPU in compile "
        "mode starts compile_pool.suggested_workers; see samu_tune.compile_pool)")
    compile_mode: Literal["compile", "verify"] = Field(
        "compile", description="what the compile pool's workers do on a GPU: compile the "
        "candidates' kernels for its target without a CUDA context (the tuning process "
        "verifies), or compile and verify them on the GPU")
    verify_cache: bool = Field(
        True, description="keep verification passes across shapes and processes "
                          "(samu_tune.verified); 0: verify every candidate every time")
    verbose: bool = Field(False, description="log dispatch decisions")
    poison: bool = Field(
        False, description="fill fresh output buffers with NaN so unwritten elements show (tests)")
    fast_launch: bool = Field(
        True, description="launch compiled Triton kernels directly after their first launch "
        "(samu_tune.launcher); 0: every launch through Triton's JITFunction.run")
    # Not SAMU_TUNE_ variables: Triton's own switch, read here so the rest of the package
    # asks one place whether Triton kernels may run on CPU tensors (and whether the user set
    # the switch, which the CLI respects instead of re-running under the interpreter).
    interpret: bool = Field(False, description="TRITON_INTERPRET=1: Triton kernels on CPU")
    interpret_set: bool = Field(
        False, description="TRITON_INTERPRET is set at all (even to 0): the user chose")
    # torchrun's: the processes of a distributed `samu-tune profile` and this one's GPU
    world_size: int = Field(1, ge=1, description="WORLD_SIZE: processes started by torchrun")
    local_rank: Optional[int] = Field(None, ge=0, description="LOCAL_RANK: this process's GPU")


_TRITON_FIELDS = ("interpret", "interpret_set", "world_size", "local_rank")


def _from_env(environ: dict[str, str]) -> Settings:
    raw: dict[str, object] = {}
    for name in Settings.model_fields:
        if name in _TRITON_FIELDS:
            continue
        value = environ.get(_PREFIX + name.upper())
        if value is not None and value != "":
            raw[name] = value
    raw["interpret"] = environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")
    raw["interpret_set"] = "TRITON_INTERPRET" in environ
    for name in ("world_size", "local_rank"):
        if environ.get(name.upper(), "") != "":
            raw[name] = environ[name.upper()]
    try:
        return Settings(**raw)
    except ValidationError as exc:
        fields = ", ".join(f"{_PREFIX}{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}"
                           for e in exc.errors())
        raise ValueError(f"invalid samu_tune environment: {fields}") from None


_SETTINGS: list[Settings] = []


def settings() -> Settings:
    """The process-wide settings, read from the environment on first use.  (A module-level
    slot rather than ``lru_cache``: torch.compile traces a call of this as a read of the
    slot, where it would trace into an ``lru_cache``'s wrapped function.)"""
    if not _SETTINGS:
        _SETTINGS.append(_from_env(dict(os.environ)))
    return _SETTINGS[0]


def reload_settings() -> Settings:
    """Forget the cached settings and read the environment again (tests, notebooks)."""
    _SETTINGS.clear()
    return settings()


@contextlib.contextmanager
def overridden(**fields):
    """The settings with ``fields`` replaced inside the block (the environment untouched), the
    same settings object as before after it: e.g. ``interpret=False`` to ask what a GPU
    process would choose from a process that runs the Triton interpreter."""
    saved = list(_SETTINGS)
    _SETTINGS[:] = [settings().model_copy(update=fields)]
    try:
        yield _SETTINGS[0]
    finally:
        _SETTINGS[:] = saved


@contextlib.contextmanager
def environment(**values: str):
    """Set the environment variables ``values`` inside the block and put back what was there
    (unset where it was unset) after it; the settings are not re-read (callers that need them
    call :func:`reload_settings`)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
