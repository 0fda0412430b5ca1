"""The rows of ``samu-tune profile``'s tables, as data (built by :mod:`.profile`, rendered
by :mod:`.render`)."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel


class ProfileRow(BaseModel):
    """One profiled problem as shown in the tables and printed by ``--json``.

    ``source``: ``tuned`` (now), ``cached`` (an existing served cache entry) or ``failed``
    (no candidate worked).  Speedups are ``other.time / winner.time``.  ``copy_bw_fraction``
    is achieved / measured copy bandwidth (None on the CPU).
    """

    key: str
    mode: str
    problem: dict[str, Any]
    source: str
    winner: Optional[str] = None
    strategy: Optional[str] = None
    config: Optional[dict[str, Any]] = None
    time_ms: Optional[float] = None
    runner_up: Optional[str] = None
    runner_up_ms: Optional[float] = None
    speedup_vs_runner_up: Optional[float] = None
    rule_default: Optional[str] = None
    rule_default_ms: Optional[float] = None
    speedup_vs_rule_default: Optional[float] = None
    copy_bw_fraction: Optional[float] = None
    evaluated: Optional[int] = None
    failed: Optional[int] = None
    skipped: Optional[int] = None
    failures: list[dict[str, str]] = []
    ineligible: dict[str, list[str]] = {}
    stopped: Optional[str] = None
    elapsed_s: Optional[float] = None
