"""Fraction of a CUDA device's copy bandwidth: the "% of copy bandwidth" column.

A scan is memory-bound: per (b, t, m) the forward reads br, bi and writes out_r, out_i (4
arrays of [B, L, M] in the writes' dtype); forward + backward moves about 10 such arrays
(DESIGN.md §5).  :func:`fraction` relates a measured time to the time a plain device-to-device
copy needs for those bytes (:func:`samu_tune.timing.copy_bandwidth` measures that copy).
A decode step (forward, ``elements`` = B*M) reads x and writes y, [B, 2M] each: the same 4
arrays of B*M (its fp32 state read and write are not counted).
"""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune.problem import TORCH_DTYPES
from samu_tune.ops.scan.problem import ScanProblem

ARRAYS = {"forward": 4, "train": 10}


def moved_bytes(problem: ScanProblem) -> int:
    """Minimal traffic of ``problem``: ARRAYS[mode] arrays of [B, L, M] in ``problem.dtype``."""
    item = torch.empty((), dtype=TORCH_DTYPES[problem.dtype]).element_size()
    return ARRAYS[problem.mode] * problem.elements * item


def fraction(problem: ScanProblem, time_ms: Optional[float], bandwidth: Optional[float]
             ) -> Optional[float]:
    """Achieved / copy bandwidth (0..1) for ``problem`` run in ``time_ms``; None when unknown
    (no time, or no bandwidth: the CPU)."""
    if time_ms is None or not bandwidth or time_ms <= 0:
        return None
    return moved_bytes(problem) / (time_ms * 1e-3) / bandwidth
