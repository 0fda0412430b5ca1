"""Scratch buffers kept between calls: what a launch writes and reads itself, or writes and
nobody reads after (the look-back's published summaries; in a no-grad forward, its control
table and a final state the caller did not ask for).

One fp32 buffer is kept per (role, device, current stream) and handed to the next launch on
that stream, grown when a launch needs more (up to 16 MiB; at most 32 kept): kernels on one
stream run in order, so a launch never finds its scratch in use by another, and a replaced
buffer is freed in stream order by torch's caching allocator. Each reuse saves an allocation
(~2.4 us of host time on an H200 host). Fresh buffers instead while a CUDA graph is being
captured (a graph keeps the addresses it captured, and its replays run on other streams) and
with ``SAMU_TUNE_POISON=1`` (every buffer NaN-filled, see :mod:`samu_tune.alloc`).
:func:`clear` drops them. Only eager calls use them, never the torch.library operators: a
CUDA-graph tree's warm-up run (not a capture) allocates into the graph's private pool, whose
blocks the tree reassigns itself.
"""
from __future__ import annotations

import torch

from samu_tune import alloc
from samu_tune.settings import settings

_KEPT: dict[tuple, torch.Tensor] = {}
# a buffer this large is not kept (its allocation's host time is small beside such a call's
# GPU time), and at most this many are kept at once (every stream a process ever used)
KEEP_MAX_WORDS = 1 << 22
KEEP_MAX_BUFFERS = 32

_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def fp32(role: str, words: int, device: torch.device) -> torch.Tensor:
    """A contiguous fp32 buffer of at least ``words`` elements (16-byte aligned, contents
    undefined), the one kept for ``role`` on ``device``'s current stream."""
    cuda = device.type == "cuda"
    if settings().poison or (cuda and (_stream_of is None or _capturing is None
                                       or _capturing())):
        return alloc.empty(max(words, 1), dtype=torch.float32, device=device)
    index = device.index
    if cuda and index is None:                     # torch.device("cuda"): the current device
        index = torch.cuda.current_device()
        device = torch.device("cuda", index)
    key = (role, device, _stream_of(index) if cuda else 0)
    kept = _KEPT.get(key)
    if kept is not None and kept.numel() >= words:
        return kept
    fresh = torch.empty(max(words, 1), dtype=torch.float32, device=device)
    if words <= KEEP_MAX_WORDS:
        if len(_KEPT) >= KEEP_MAX_BUFFERS:
            _KEPT.clear()
        _KEPT[key] = fresh
    return fresh


def clear() -> None:
    """Drop every kept buffer (their memory returns to torch's caching allocator)."""
    _KEPT.clear()
