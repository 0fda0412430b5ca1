"""Tuned winners on disk: one JSON file per device signature, and an in-memory index.

Layout and file format: :mod:`samu_tune.cache_file`.  Entries of every op share the file: a scan's key is bare (``B8-L4096-M512-bf16-train``), any
other op's starts with its name (``decode:B4-M1024-bf16-h0``; see :mod:`samu_tune.problem`),
and the entry's strategy is looked up among that op's strategies.  An older samu_tune reading
a file with such entries serves its scan entries and reports the others as not served.

Every entry carries the versions it was measured with and its strategy's ``source_hash``.

Serving rules (:func:`why_not_served`): an entry of the user cache is served only when its
samu_tune, torch and triton versions equal the running ones, its strategy is registered with
the same source hash, and its config parses.  Tables shipped in ``samu_tune/defaults/`` (same
format, measured by the developers on real GPUs) are served across versions and source edits:
they only need the strategy to exist and the config to parse (and, at dispatch, to be valid
for the problem) -- a shipped table is a good guess to start from, not a measurement of the
running code.

Reads go through an in-memory index per file: loaded once per process, reloaded when the
file's mtime changed, checked at most every :data:`RELOAD_CHECK_S` seconds (or after
:func:`invalidate`).  :func:`generation` changes whenever the index does, so callers can
memoize decisions on it.
"""
from __future__ import annotations

import itertools
import logging
import math
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Union

from samu_tune import registry, verified
from samu_tune.device import DeviceInfo, device_info
from samu_tune.problem import Problem, problem_from_key
from samu_tune.settings import settings
from samu_tune.cache_file import (FORMAT, LOCK_TIMEOUT_S, CacheEntry, CacheFile, CacheMeta,  # noqa: F401
                                  CacheWarning, EntryStatus, RunnerUp, _empty, _load_locked,
                                  _lock, _now_iso, _read_any, _report, _Unreadable, _parse,
                                  _write_atomic, versions)

if TYPE_CHECKING:
    from samu_tune.results import TuneResult

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 2.0
DEFAULTS_DIR = Path(__file__).resolve().parent / "defaults"

SignatureArg = Union[str, DeviceInfo, None]


@lru_cache(maxsize=1)
def _platform_dir() -> Path:
    import platformdirs
    return Path(platformdirs.user_cache_dir("samu_tune"))


def cache_dir() -> Path:
    """The cache directory (``SAMU_TUNE_CACHE_DIR`` or the platform user cache dir)."""
    return settings().cache_dir or _platform_dir()


def signature_of(signature: SignatureArg = None) -> str:
    """A signature from a string, a DeviceInfo, or None (the current device)."""
    if signature is None:
        return device_info().signature()
    if isinstance(signature, DeviceInfo):
        return signature.signature()
    return str(signature)


def path(signature: SignatureArg = None) -> Path:
    """The cache file of a device signature (default: the current device)."""
    return cache_dir() / f"{signature_of(signature)}.json"


def shipped_path(signature: SignatureArg = None) -> Path:
    return DEFAULTS_DIR / f"{signature_of(signature)}.json"


def signatures() -> list[str]:
    """Signatures that have a winner cache file in :func:`cache_dir` (not the tuner's
    verdict files beside them, :func:`samu_tune.verified.path`)."""
    d = cache_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if not p.stem.startswith(verified.PREFIX))


def _newer(a: CacheEntry, b: CacheEntry) -> CacheEntry:
    """Of two entries for one key, the one measured last (``b`` on a tie)."""
    return a if a.measured_at > b.measured_at else b


def _update(p: Path, signature: str, change) -> CacheFile:
    """Read-merge-write: ``change(entries)`` edits the fresh entries under the lock."""
    with _lock(p):
        data = _load_locked(p, signature)
        entries = dict(data.entries)
        change(entries)
        v = versions()
        meta = data.meta.model_copy(update=dict(
            samu_tune=v["samu_tune"], torch=v["torch"], triton=v["triton"],
            written_at=_now_iso()))
        if meta.device is None:
            dev = device_info()
            if dev.signature() == signature:
                meta = meta.model_copy(update={"device": dev})
        data = CacheFile(meta=meta, entries=entries)
        _write_atomic(p, data)
    _table_for(p, signature, shipped=False).refresh(force=True)
    return data


def why_not_served(entry: CacheEntry, *, shipped: bool = False) -> Optional[str]:
    """None when ``entry`` may be served, else why not (see the module docstring)."""
    if not shipped:
        running = versions()
        for name in ("samu_tune", "torch", "triton"):
            if entry.versions.get(name) != running[name]:
                return (f"measured with {name} {entry.versions.get(name)} "
                        f"(running {running[name]})")
    try:
        strat = registry.get(entry.strategy, entry.op)
    except ValueError:
        what = "strategy" if entry.op == "scan" else f"{entry.op} strategy"
        return f"{what} {entry.strategy!r} is not registered"
    if not shipped and strat.source_hash != entry.source_hash:
        return f"strategy {entry.strategy!r} changed since (source hash {entry.source_hash} " \
               f"!= {strat.source_hash})"
    try:
        strat.parse_config(entry.config)
    except (ValueError, TypeError) as exc:
        return f"config {entry.config} does not parse for {entry.strategy!r}: " \
               f"{str(exc).splitlines()[0]}"
    return None


# ---- the in-memory index -----------------------------------------------------------------

@dataclass
class _Table:
    """The entries of one file, with a per-feature list of (coords, entry) for nearest-key
    search (``coords``: the problem's point in log-space, ``problem.coords()``)."""

    path: Path
    signature: str
    shipped: bool
    entries: dict[str, CacheEntry] = field(default_factory=dict)
    by_feature: dict[str, list[tuple[tuple[float, ...], CacheEntry]]] = field(default_factory=dict)
    stamp: Optional[tuple[int, int]] = None
    checked: float = -math.inf
    generation: int = 0           # unique across tables: see _GENERATIONS

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.checked < RELOAD_CHECK_S:
            return
        self.checked = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self.stamp and not force:
            return
        data = self._read()
        self.stamp = stamp
        self._index(data.entries if data is not None else {})

    def _read(self) -> Optional[CacheFile]:
        try:
            return _parse(self.path, self.signature)
        except _Unreadable as exc:
            if self.shipped:
                _report(f"samu_tune shipped table {self.path} is unusable ({exc}); ignored",
                        f"{self.path}:shipped")
                return None
            # move aside only under the lock: a writer may just have replaced the file
            try:
                with _lock(self.path):
                    return _load_locked(self.path, self.signature)
            except OSError as lock_exc:  # read-only cache dir, lock timeout: ignore, go on
                _report(f"samu_tune cache file {self.path} is unusable ({exc}) and could not "
                        f"be locked ({lock_exc}); ignored", f"{self.path}:lock")
                return None

    def _index(self, entries: dict[str, CacheEntry]) -> None:
        self.entries = dict(entries)
        by_feature: dict[str, list[tuple[tuple[float, ...], CacheEntry]]] = {}
        for key, entry in self.entries.items():
            try:
                p = problem_from_key(key)
            except ValueError:
                continue
            by_feature.setdefault(p.feature_key(), []).append((p.coords(), entry))
        self.by_feature = by_feature
        self.generation = next(_GENERATIONS)
        _SEEN.clear()


_GENERATIONS = itertools.count(1)
_TABLES: dict[tuple[Optional[Path], str], _Table] = {}
_SEEN: dict[tuple, tuple] = {}  # (dir, signature) -> (generation, time); cleared on changes


def _table_for(p: Path, signature: str, shipped: bool) -> _Table:
    key = (None if shipped else p.parent, signature)
    table = _TABLES.get(key)
    if table is None or table.path != p:
        table = _TABLES[key] = _Table(p, signature, shipped)
    return table


def _table(signature: SignatureArg = None, *, shipped: bool = False) -> _Table:
    sig = signature if isinstance(signature, str) else signature_of(signature)
    # keyed by (directory, signature) so that a hit costs no Path arithmetic
    table = _TABLES.get((None if shipped else cache_dir(), sig))
    if table is None:
        p = shipped_path(sig) if shipped else cache_dir() / f"{sig}.json"
        table = _table_for(p, sig, shipped)
    table.refresh()
    return table


def generation(signature: SignatureArg = None) -> tuple[int, int]:
    """A token that changes whenever ``signature``'s user cache or shipped table is (re)loaded
    or written (unique across directories); a repeat within :data:`RELOAD_CHECK_S` s is a lookup."""
    key = (cache_dir(), signature if isinstance(signature, str) else signature_of(signature))
    seen, now = _SEEN.get(key), time.monotonic()
    if seen and now - seen[1] < RELOAD_CHECK_S:
        return seen[0]
    gen = _table(key[1]).generation, _table(key[1], shipped=True).generation
    _SEEN[key] = (gen, now)
    return gen


def invalidate() -> None:
    """Forget every in-memory index: the next lookup reads the files again."""
    _TABLES.clear()
    _SEEN.clear()


# ---- lookups -------------------------------------------------------------------------------

def lookup(problem: Problem, signature: SignatureArg = None, *, shipped: bool = False
           ) -> Optional[CacheEntry]:
    """The served entry for exactly ``problem.key()``, or None."""
    entry = _table(signature, shipped=shipped).entries.get(problem.key())
    if entry is None or why_not_served(entry, shipped=shipped) is not None:
        return None
    return entry


def nearest(problem: Problem, signature: SignatureArg = None, *, shipped: bool = False,
            include_exact: bool = False, features=None) -> list[tuple[float, CacheEntry]]:
    """Served entries with the same features (``problem.feature_key()``, or any of the keys
    ``features`` names), nearest first.  Distance: Euclidean in ``problem.coords()`` (the
    scan: (log(B*M), log(L)); the decode step: (log B, log M)).  The exact key is left out
    unless ``include_exact``."""
    table = _table(signature, shipped=shipped)
    here, key, out = problem.coords(), problem.key(), []
    for feature in features or (problem.feature_key(),):
        for there, entry in table.by_feature.get(feature, ()):
            if (entry.key != key or include_exact) and why_not_served(
                    entry, shipped=shipped) is None:
                out.append((math.dist(there, here), entry))
    out.sort(key=lambda item: (item[0], item[1].key))
    return out


def entries(signature: SignatureArg = None, *, all_devices: bool = False,
            include_shipped: bool = False) -> list[EntryStatus]:
    """Every entry of the cache file(s) with whether it is served and why not."""
    sigs = signatures() if all_devices else [signature_of(signature)]
    out = []
    for sig in sigs:
        for shipped in ((False, True) if include_shipped else (False,)):
            table = _table(sig, shipped=shipped)
            for key in sorted(table.entries):
                entry = table.entries[key]
                reason = why_not_served(entry, shipped=shipped)
                out.append(EntryStatus(signature=sig, entry=entry, served=reason is None,
                                       reason=reason, shipped=shipped))
    return out


# ---- writing ---------------------------------------------------------------------------------

def entry_from_result(result: "TuneResult") -> CacheEntry:
    """The cache entry of a tune result's winner."""
    if result.winner is None:
        raise ValueError(f"tune result for {result.problem.key()} has no winner")
    w, r = result.winner, result.runner_up
    return CacheEntry(
        key=result.problem.key(), mode=result.mode, strategy=w.strategy, config=w.config,
        time_ms=w.time_ms, margin=result.margin,
        runner_up=None if r is None else RunnerUp(strategy=r.strategy, config=r.config,
                                                   time_ms=r.time_ms),
        source_hash=registry.get(w.strategy, result.problem.op).source_hash,
        measured_at=result.measured_at or _now_iso(), cpu_wall_time=result.cpu_wall_time,
        versions=dict(versions()), search=result.search, host_ms=w.host_ms)


def _check_device(entry: CacheEntry, signature: str) -> None:
    """CPU wall-time entries never go into a GPU's table (signatures ``cpu*`` are the CPU's)."""
    if entry.cpu_wall_time and not signature.startswith("cpu"):
        raise ValueError(f"entry {entry.key} holds a CPU wall time: it cannot go into the "
                         f"table of {signature!r}")


def put(entry: CacheEntry, signature: SignatureArg = None) -> None:
    """Add or replace ``entry`` in the cache file of ``signature`` (read-merge-write)."""
    sig = signature_of(signature)
    _check_device(entry, sig)

    def change(entries):
        entries[entry.key] = entry
    _update(cache_dir() / f"{sig}.json", sig, change)


def record(result: "TuneResult") -> CacheEntry:
    """Store a tune result's winner in the cache file of the device it was measured on."""
    entry = entry_from_result(result)
    put(entry, result.device.signature())
    return entry


def remove(keys: Iterable[str], signature: SignatureArg = None) -> int:
    """Remove entries by problem key; returns how many were removed."""
    sig = signature_of(signature)
    keys = set(keys)
    removed = []

    def change(entries):
        for k in keys & entries.keys():
            del entries[k]
            removed.append(k)
    _update(cache_dir() / f"{sig}.json", sig, change)
    return len(removed)


def clear(signature: SignatureArg = None, *, all_devices: bool = False) -> int:
    """Remove every entry (of one signature, or of all); returns how many were removed."""
    sigs = signatures() if all_devices else [signature_of(signature)]
    counted: list[int] = []

    def change(entries):
        counted.append(len(entries))
        entries.clear()
    for sig in sigs:
        p = cache_dir() / f"{sig}.json"
        if p.exists():
            _update(p, sig, change)
    return sum(counted)


def export(dest: Union[str, Path], signature: SignatureArg = None, *,
           served_only: bool = False) -> int:
    """Write the cache of ``signature`` (default: this device) to ``dest``; returns #entries."""
    sig = signature_of(signature)
    src = cache_dir() / f"{sig}.json"
    with _lock(src):
        data = _load_locked(src, sig)
    if served_only:
        data = CacheFile(meta=data.meta, entries={
            k: e for k, e in data.entries.items() if why_not_served(e) is None})
    _write_atomic(Path(dest), data)
    return len(data.entries)


def import_(src: Union[str, Path], *, signature: Optional[str] = None) -> int:
    """Merge the entries of file ``src`` into the cache of its device signature (or
    ``signature``); for a key in both, the entry measured last wins.  Returns how many entries
    were added or replaced."""
    data = _read_any(Path(src))
    sig = signature or data.meta.signature
    for e in data.entries.values():
        _check_device(e, sig)
    changed = []

    def change(entries):
        for k, e in data.entries.items():
            if k not in entries or _newer(entries[k], e) is e and entries[k] != e:
                entries[k] = e
                changed.append(k)
    _update(cache_dir() / f"{sig}.json", sig, change)
    return len(changed)


def merge(sources: Sequence[Union[str, Path]], dest: Union[str, Path, None] = None) -> int:
    """Merge cache files.  With ``dest=None`` each source is imported into the cache; else
    the sources (and ``dest`` if it exists) are merged into the file ``dest``, which must all
    have one device signature.  For a key in several, the entry measured last wins.  Returns
    the number of entries written (or imported)."""
    if dest is None:
        return sum(import_(s) for s in sources)
    datas = [_read_any(Path(s)) for s in sources]
    if not datas:
        raise ValueError("merge needs at least one source file")
    sig = datas[0].meta.signature
    for s, d in zip(sources, datas):
        if d.meta.signature != sig:
            raise ValueError(f"cannot merge {s} (signature {d.meta.signature!r}) into a "
                             f"table of {sig!r}")
    dest = Path(dest)
    with _lock(dest):
        base = _parse(dest, sig) if dest.exists() else None
        entries = dict(base.entries) if base is not None else {}
        for d in datas:
            for k, e in d.entries.items():
                entries[k] = _newer(entries[k], e) if k in entries else e
        meta = (base or datas[0]).meta.model_copy(update={"written_at": _now_iso()})
        _write_atomic(dest, CacheFile(meta=meta, entries=entries))
    return len(entries)
