"""Verification verdicts kept across shapes and processes: a candidate that passed verification
on a problem is not verified on it again.

The tuner verifies each candidate on a small problem (the op spec's ``verification_problem``),
and many real shapes share one: every scan shape with B >= 2, L a multiple of 64 above 320 and
M a multiple of 32 above 64 is verified at (2, 256, 64).  Kernels take B, L and M as runtime
values, so those runs compile the same binary and compute the same numbers.  A pass is stored
under everything that decides it -- op, strategy, its source hash, config, the verification
problem's key, the seed, the samu_tune / torch / triton versions and a digest of the whole
package's code (the shared autograd, launch and verification code is no strategy's module) --
in
``<cache_dir>/verified-<device signature>.json``; a later tune of any shape that needs the same
verification reads it instead.  Failures are not stored (a failure can come from the process's
state, e.g. a CUDA context poisoned by an earlier candidate): they are verified again, and so
is every candidate of a strategy that lists no modules (its code is not hashed).
``SAMU_TUNE_VERIFY_CACHE=0`` turns the store off.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from samu_tune.cache_file import _lock, versions, write_text_atomic
from samu_tune.settings import settings

FORMAT = 1

# path -> (mtime_ns, verdicts): one read per file and process while it does not change
_LOADED: dict[Path, tuple[int, dict[str, Any]]] = {}
# passes of this process, kept also where the file cannot be written
_MEMORY: dict[tuple[str, str], float] = {}


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """sha256 (16 hex) of the code of every module of the package
    (:func:`samu_tune.registry.code_text`: documentation edits do not count)."""
    from samu_tune.registry import code_text
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(code_text(path.read_text()).encode())
    return digest.hexdigest()[:16]


def key(op: str, strategy: str, source_hash: str, config: dict, problem_key: str,
        seed: int) -> str:
    """The stored key of one verification (``config`` as JSON-able dict)."""
    v = versions()
    cfg = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return "|".join((op, strategy, source_hash, cfg, problem_key, f"seed{seed}",
                     v["samu_tune"], v["torch"], v["triton"], package_digest()))


# the verdict files' name prefix, beside the winner caches named by signature alone
PREFIX = "verified-"


def path(signature: str) -> Path:
    from samu_tune.cache import cache_dir
    return cache_dir() / f"{PREFIX}{signature}.json"


def _read(p: Path, fresh: bool = False) -> dict[str, Any]:
    """The file's verdicts ({} when missing or unreadable); ``fresh``: read it even when its
    mtime is the one seen last (under the write lock)."""
    try:
        mtime = p.stat().st_mtime_ns
    except OSError:
        return {}
    hit = _LOADED.get(p)
    if hit is not None and hit[0] == mtime and not fresh:
        return hit[1]
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        data = None
    verdicts = data.get("verdicts") if isinstance(data, dict) and data.get("format") == FORMAT \
        else None
    if not isinstance(verdicts, dict):
        verdicts = {}     # unreadable or foreign: nothing is known; the next write replaces it
    _LOADED[p] = (mtime, verdicts)
    return verdicts


def passed(signature: str, verification: str) -> Optional[float]:
    """The seconds a stored pass of ``verification`` (a :func:`key`) took, or None."""
    if not settings().verify_cache:
        return None
    if (signature, verification) in _MEMORY:
        return _MEMORY[signature, verification]
    hit = _read(path(signature)).get(verification)
    try:
        return float(hit["seconds"])
    except (TypeError, KeyError, ValueError):
        return None       # absent or malformed: verified again


def record_pass(signature: str, verification: str, seconds: float) -> None:
    """Store a pass (read-merge-write under the file's lock, atomic replace); an unwritable
    cache directory is not an error: the pass is then kept for this process only."""
    if not settings().verify_cache:
        return
    _MEMORY[signature, verification] = seconds
    p = path(signature)
    try:
        with _lock(p):
            verdicts = dict(_read(p, fresh=True))
            verdicts[verification] = {"seconds": round(seconds, 4)}
            write_text_atomic(p, json.dumps({"format": FORMAT, "verdicts": verdicts}))
            _LOADED.pop(p, None)
    except OSError:
        pass
