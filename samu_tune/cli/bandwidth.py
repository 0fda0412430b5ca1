"""Copy bandwidth of a CUDA device, the yardstick of the "% of copy bandwidth" column.

A scan is memory-bound: per (b, t, m) the forward reads br, bi and writes out_r, out_i (4
arrays of [B, L, M] in the writes' dtype); forward + backward moves about 10 such arrays
(DESIGN.md §5).  :func:`fraction` relates a measured time to the time a plain device-to-device
copy needs for those bytes.
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from typing import Optional

import torch

from ..problem import TORCH_DTYPES, ScanProblem

ARRAYS = {"forward": 4, "train": 10}


def moved_bytes(problem: ScanProblem) -> int:
    """Minimal traffic of ``problem``: ARRAYS[mode] arrays of [B, L, M] in ``problem.dtype``."""
    item = torch.empty((), dtype=TORCH_DTYPES[problem.dtype]).element_size()
    return ARRAYS[problem.mode] * problem.elements * item


@lru_cache(maxsize=None)
def copy_bandwidth(device_index: int = 0, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Bytes per second of ``dst.copy_(src)`` on one CUDA device (read + write counted).

    ``nbytes`` per buffer (capped at an eighth of the free memory), median of ``reps`` timed
    copies after a warm-up.
    """
    device = torch.device("cuda", device_index)
    free, _ = torch.cuda.mem_get_info(device)
    n = max(1 << 20, min(nbytes, free // 8)) // 16 * 16
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(3):
        dst.copy_(src)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        dst.copy_(src)
        end.record()
    torch.cuda.synchronize(device)
    ms = statistics.median(s.elapsed_time(e) for s, e in events)
    del src, dst
    return 2 * n / (ms * 1e-3)


def fraction(problem: ScanProblem, time_ms: Optional[float], bandwidth: Optional[float]
             ) -> Optional[float]:
    """Achieved / copy bandwidth (0..1) for ``problem`` run in ``time_ms``; None when unknown
    (no time, or no bandwidth: the CPU)."""
    if time_ms is None or not bandwidth or time_ms <= 0:
        return None
    return moved_bytes(problem) / (time_ms * 1e-3) / bandwidth
