"""Fraction of a CUDA device's copy bandwidth: the "% of copy bandwidth" column.

A scan is memory-bound: per (b, t, m) the forward reads br, bi and writes out_r, out_i (4
arrays of [B, L, M] in the writes' dtype); forward + backward moves about 10 such arrays
(DESIGN.md §5).  :func:`fraction` relates a measured time to the time a plain device-to-device
copy needs for those bytes (:func:`samu_tune.timing.copy_bandwidth` measures that copy).
A decode step (forward, ``elements`` = B*M) reads x and writes y, [B, 2M] each: the same 4
arrays of B*M (its fp32 state read and write are not counted).  A linear scan's forward reads
a and b and writes h, [B, L, D] each (pairs when complex), a in its own dtype; forward +
backward also reads a, h and d h and writes d a and d b: 3 arrays in a's dtype, 5 in b's.
"""
from __future__ import annotations

from typing import Optional

from samu_tune.problem import TORCH_DTYPES, Problem

ARRAYS = {"forward": 4, "train": 10}


def moved_bytes(problem: Problem) -> int:
    """Minimal traffic of ``problem`` (module docstring): ARRAYS[mode] arrays of [B, L, M] in
    ``problem.dtype``; a linear scan's its own."""
    item = TORCH_DTYPES[problem.dtype].itemsize
    if problem.op == "linear":
        a_item = TORCH_DTYPES[problem.a_dtype].itemsize
        arrays = (3 * a_item + 5 * item) if problem.backward else (a_item + 2 * item)
        return (2 if problem.complex else 1) * problem.B * problem.L * problem.D * arrays
    return ARRAYS[problem.mode] * problem.elements * item


def fraction(problem: Problem, time_ms: Optional[float], bandwidth: Optional[float]
             ) -> Optional[float]:
    """Achieved / copy bandwidth (0..1) for ``problem`` run in ``time_ms``; None when unknown
    (no time, or no bandwidth: the CPU)."""
    if time_ms is None or not bandwidth or time_ms <= 0:
        return None
    return moved_bytes(problem) / (time_ms * 1e-3) / bandwidth
