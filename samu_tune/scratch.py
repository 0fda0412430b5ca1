"""Scratch buffers kept between calls: what a launch writes and reads itself, or writes and
nobody reads after (the look-back's published summaries; in a no-grad forward, its control
table and a final state the caller did not ask for), and the look-back's int32 head of
ticket counter and statuses (:func:`sync_head`), which a no-grad forward reuses without a
zero fill.

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

import threading
from typing import Optional

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


def _stream_key(device: torch.device) -> Optional[tuple]:
    """(device with its index, current stream) of a kept buffer on ``device``, or None when
    none may be kept: poisoned buffers asked for, or a CUDA graph being captured."""
    cuda = device.type == "cuda"
    if settings().poison or (cuda and (_stream_of is None or _capturing is None
                                       or _capturing())):
        return None
    if not cuda:
        return device, 0
    index = device.index
    if index is None:                              # torch.device("cuda"): the current device
        index = torch.cuda.current_device()
        device = torch.device("cuda", index)
    return device, _stream_of(index)


def fp32(role: str, words: int, device: torch.device) -> torch.Tensor:
    """A contiguous fp32 buffer of at least ``words`` elements (16-byte aligned, contents
    undefined), the one kept for ``role`` on ``device``'s current stream."""
    where = _stream_key(device)
    if where is None:
        return alloc.empty(max(words, 1), dtype=torch.float32, device=device)
    key = (role, *where)
    kept = _KEPT.get(key)
    if kept is not None and kept.numel() >= words:
        return kept
    fresh = torch.empty(max(words, 1), dtype=torch.float32, device=device)
    if words <= KEEP_MAX_WORDS:
        if len(_KEPT) >= KEEP_MAX_BUFFERS:
            _KEPT.clear()
        _KEPT[key] = fresh
    return fresh


class _Head:
    """A kept look-back head and what the launches on it left: tickets taken, launches."""

    __slots__ = ("buf", "tickets", "launches")

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf, self.tickets, self.launches = buf, 0, 0


_HEADS: dict[tuple, _Head] = {}
_HEAD_LOCK = threading.Lock()
# the head's words are int32: before a launch could pass this, the head is zeroed again
HEAD_LIMIT = (1 << 31) - 1


def sync_head(words: int, slots: int, device: torch.device
              ) -> Optional[tuple[torch.Tensor, int, int]]:
    """The look-back head kept on ``device``'s current stream for a launch of ``slots``
    programs: (int32 buffer of at least ``words`` elements, ticket0, status0), the values
    :func:`samu_tune.kernels.lookback.lookback_scan` takes for a head it need not find
    zeroed.  Each call is one launch: the next call's ticket0 is this one's plus ``slots``
    (every program takes one ticket) and its status0 is 3 more (a launch publishes status0
    + 1 or + 2).  Launches on one stream run in order, so a launch finds the words its
    predecessors left; a fresh or grown head is zero-filled once, and zero-filled again (in
    stream order) before a counter could pass the int32 range.  None where no buffer is kept
    (poison, CUDA graph capture) or the head would be larger than a kept buffer: the caller
    zero-fills a fresh head then.  Thread-safe: two threads launching on one stream get
    distinct launches."""
    where = _stream_key(device)
    if where is None or words > KEEP_MAX_WORDS:
        return None
    with _HEAD_LOCK:
        head = _HEADS.get(where)
        if head is None or head.buf.numel() < words:
            if head is None and len(_HEADS) >= KEEP_MAX_BUFFERS:
                _HEADS.clear()
            # grown by powers of two: a sequence of shapes settles on one buffer
            size = 1 << max(6, (words - 1).bit_length())
            head = _HEADS[where] = _Head(torch.zeros(size, dtype=torch.int32, device=device))
        elif head.tickets + slots > HEAD_LIMIT or 3 * head.launches + 2 > HEAD_LIMIT:
            head.buf.zero_()
            head.tickets = head.launches = 0
        ticket0, status0 = head.tickets, 3 * head.launches
        head.tickets += slots
        head.launches += 1
        return head.buf, ticket0, status0


def drop_head(device: torch.device) -> None:
    """Forget the head kept on ``device``'s current stream (the next launch gets a fresh
    zeroed one): a launch that took its counts from :func:`sync_head` failed to start, so the
    counts no longer match the words."""
    where = _stream_key(device)
    if where is not None:
        with _HEAD_LOCK:
            _HEADS.pop(where, None)


def head(words: int, slots: int, device: torch.device, kept: bool
         ) -> tuple[torch.Tensor, int, int]:
    """:func:`sync_head` where ``kept`` and one is kept, else a fresh zeroed head of ``words``
    (ticket0 = status0 = 0)."""
    got = sync_head(words, slots, device) if kept else None
    return got or (torch.zeros(words, dtype=torch.int32, device=device), 0, 0)


def clear() -> None:
    """Drop every kept buffer (their memory returns to torch's caching allocator)."""
    _KEPT.clear()
    with _HEAD_LOCK:
        _HEADS.clear()
