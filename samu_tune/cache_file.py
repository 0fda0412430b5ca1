"""The cache's file format and its safe reading and writing (:mod:`samu_tune.cache` serves from
it): the schema (:class:`CacheFile` = meta + entries by key), parsing that moves a corrupt or
foreign file aside instead of failing, atomic writes (temporary file + rename) and
read-modify-write under a file lock, so concurrent writers lose no entry.

Layout: ``<cache_dir>/<device signature>.json`` (``cache_dir`` is ``SAMU_TUNE_CACHE_DIR`` or
``platformdirs.user_cache_dir("samu_tune")``; the CPU interpreter's signature is
``cpu-interpreter``, so its wall-time entries never mix with GPU ones)::

    {"meta": {"format": 1, "signature": ..., "samu_tune": ..., "torch": ..., "triton": ...,
              "device": {...DeviceInfo...}, "written_at": ...},
     "entries": {"<problem key>": {...CacheEntry...}, ...}}

Writes are read-merge-write under a ``filelock`` lock on ``<file>.lock`` with an atomic
replace (temp file + ``os.replace``), so concurrent writers from several processes lose no
entry.  A corrupt or foreign file is reported once (a :class:`CacheWarning` and a log line),
moved aside as ``<file>.corrupt-<timestamp>`` and treated as empty; it is never fatal.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from filelock import FileLock
from pydantic import BaseModel, ValidationError

from samu_tune.device import DeviceInfo, device_info
from samu_tune.problem import Problem, op_of_key, problem_from_key

log = logging.getLogger("samu_tune.cache")

FORMAT = 1
LOCK_TIMEOUT_S = 60.0


class CacheWarning(UserWarning):
    """A cache file could not be used (corrupt, foreign); it was moved aside or ignored."""


class RunnerUp(BaseModel):
    strategy: str
    config: dict[str, Any]
    time_ms: float


class CacheEntry(BaseModel):
    """One tuned winner.  ``time_ms`` is its median (CPU wall time when ``cpu_wall_time``, else
    GPU time); ``host_ms`` the host time of one call beside it (None in entries written before
    it was measured, and for CPU entries)."""

    key: str
    mode: Literal["train", "forward"]
    strategy: str
    config: dict[str, Any]
    time_ms: float
    runner_up: Optional[RunnerUp] = None
    margin: Optional[float] = None
    source_hash: str
    measured_at: str
    cpu_wall_time: bool
    versions: dict[str, str]
    search: Optional[str] = None
    host_ms: Optional[float] = None

    @property
    def op(self) -> str:
        """The op of the entry's key (``scan`` for a bare key)."""
        return op_of_key(self.key)

    def problem(self, device: str = "cuda") -> Problem:
        """The problem of :attr:`key` (of any op)."""
        return problem_from_key(self.key, device=device)


class CacheMeta(BaseModel):
    format: int = FORMAT
    signature: str
    samu_tune: str
    torch: str
    triton: str
    device: Optional[DeviceInfo] = None
    written_at: str = ""


class CacheFile(BaseModel):
    meta: CacheMeta
    entries: dict[str, CacheEntry] = {}


class EntryStatus(BaseModel):
    """An entry as listed: where it lives and whether (or why not) it is served."""

    signature: str
    entry: CacheEntry
    served: bool
    reason: Optional[str] = None
    shipped: bool = False


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """samu_tune, torch and triton versions of this process."""
    from samu_tune import __version__
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # pragma: no cover - triton is a dependency
        triton_version = "none"
    return {"samu_tune": __version__, "torch": torch.__version__, "triton": triton_version}


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _empty(signature: str) -> CacheFile:
    v = versions()
    dev = device_info()
    return CacheFile(meta=CacheMeta(signature=signature, samu_tune=v["samu_tune"],
                                    torch=v["torch"], triton=v["triton"],
                                    device=dev if dev.signature() == signature else None))


# ---- reading, writing, corruption --------------------------------------------------------

_REPORTED: set[str] = set()


def _report(message: str, once_key: str) -> None:
    if once_key in _REPORTED:
        return
    _REPORTED.add(once_key)
    # once on the console: the warning; the log too where the program set up logging (with
    # none, logging's last-resort handler would print the same line a second time)
    if log.hasHandlers():
        log.warning(message)
    warnings.warn(message, CacheWarning, stacklevel=3)


class _Unreadable(Exception):
    pass


def _parse(p: Path, signature: Optional[str]) -> Optional[CacheFile]:
    """The file's content; None when absent; :class:`_Unreadable` when corrupt or foreign."""
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Unreadable(f"cannot read: {exc}") from None
    try:
        data = CacheFile.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _Unreadable(f"not a samu_tune cache file ({first})") from None
    if data.meta.format != FORMAT:
        raise _Unreadable(f"format {data.meta.format} != {FORMAT}")
    if signature is not None and data.meta.signature != signature:
        raise _Unreadable(f"foreign file: signature {data.meta.signature!r} != {signature!r}")
    return data


def _move_aside(p: Path, why: str) -> None:
    stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S%f")
    aside = p.with_name(f"{p.name}.corrupt-{stamp}")
    try:
        os.replace(p, aside)
        where = f"moved aside to {aside.name}"
    except OSError as exc:
        where = f"could not be moved aside ({exc})"
    _report(f"samu_tune cache file {p} is unusable ({why}); {where} and ignored",
            f"{p}:{stamp}")


def _load_locked(p: Path, signature: str) -> CacheFile:
    """Read ``p`` while holding its lock, moving a corrupt file aside (then empty)."""
    try:
        data = _parse(p, signature)
    except _Unreadable as exc:
        _move_aside(p, str(exc))
        data = None
    return data if data is not None else _empty(signature)


def _write_atomic(p: Path, data: CacheFile) -> None:
    write_text_atomic(p, data.model_dump_json(indent=1))


def write_text_atomic(p: Path, text: str) -> None:
    """Write ``text`` to ``p`` through a temporary file and a rename: readers see the old
    file or the new one, never a part; the temporary file is removed on any failure."""
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _lock(p: Path) -> FileLock:
    p.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(p) + ".lock", timeout=LOCK_TIMEOUT_S)


def _read_any(p: Path) -> CacheFile:
    """A file named by the user (export / import / merge): errors are raised, not hidden."""
    try:
        data = _parse(p, None)
    except _Unreadable as exc:
        raise ValueError(f"{p}: {exc}") from None
    if data is None:
        raise FileNotFoundError(f"{p}: no such cache file")
    return data
