"""Scratch buffers kept between calls: what a launch writes and reads itself, or writes and
nobody reads after (the look-back's published summaries; in a no-grad forward, its control
table and a final state the caller did not ask for), and the look-back's int32 head of
ticket counter and statuses (:class:`Head`), which a no-grad forward reuses without a zero
fill.

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
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
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
    index = _current_device()
    if device.index is None:                       # torch.device("cuda"): the current device
        device = torch.device("cuda", index)
    elif device.index != index:
        # launches go to the current device's stream: a buffer keyed by another device's
        # stream would be filled and grown out of order with them
        return None
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
    """A kept look-back head, what the launches on it left (tickets taken, launches), and
    the lock a launch holds from taking the counts until its kernel is enqueued."""

    __slots__ = ("buf", "tickets", "launches", "lock")

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf, self.tickets, self.launches = buf, 0, 0
        self.lock = threading.Lock()


_HEADS: dict[tuple, _Head] = {}
_HEAD_LOCK = threading.Lock()
# the head's words are int32: before a launch could pass this, the head is zeroed again
HEAD_LIMIT = (1 << 31) - 1


def _take_head(words: int, slots: int, device: torch.device) -> Optional[_Head]:
    """The head kept on ``device``'s current stream, locked, at least ``words`` long and with
    room for ``slots`` more tickets and one more launch (grown or zeroed again, in stream
    order, where not); None where none is kept (poison, capture, a head larger than a kept
    buffer) or another thread holds it."""
    where = _stream_key(device)
    if where is None or words > KEEP_MAX_WORDS:
        return None
    with _HEAD_LOCK:
        head = _HEADS.get(where)
        if head is None:
            if len(_HEADS) >= KEEP_MAX_BUFFERS:
                _HEADS.clear()
            # empty: grown (zeroed) below, with the head's lock held
            head = _HEADS[where] = _Head(torch.empty(0, dtype=torch.int32, device=device))
        if not head.lock.acquire(blocking=False):
            return None
    if head.buf.numel() < words:
        # grown by powers of two: a sequence of shapes settles on one buffer
        head.buf = torch.zeros(1 << max(6, (words - 1).bit_length()), dtype=torch.int32,
                               device=device)
        head.tickets = head.launches = 0
    elif head.tickets + slots > HEAD_LIMIT or 3 * head.launches + 2 > HEAD_LIMIT:
        head.buf.zero_()
        head.tickets = head.launches = 0
    return head


class Head:
    """The int32 head of one look-back launch, as ``with Head(...) as (buf, ticket0,
    status0): <launch>`` -- the values :func:`samu_tune.kernels.lookback.lookback_scan`
    takes for a head it need not find zeroed.

    ``sync`` given: it (zeroed by the caller), 0, 0.  Else, where ``kept``, the head kept on
    ``device``'s current stream: its ticket0 is the tickets the launches before took (every
    program takes one) and its status0 is 3 per launch before (a launch publishes status0 +
    1 or + 2).  Launches on one stream run in order, so a launch finds the words its
    predecessors left; a head is zero-filled when made or grown and again before a counter
    could leave the int32 range.  The head stays locked until the launch is enqueued, and
    its counts advance only when the launch returns without an exception: launches on one
    head are enqueued in the order of their counts, and a launch that raised took no
    tickets.  Another thread's launch meanwhile, poison, capture and ``kept`` False get a
    fresh zeroed head of ``words`` instead.  A launch that returns without running (a test
    stub, a Triton cache hook that skips it) leaves the counts wrong: :func:`clear` after
    it."""

    __slots__ = ("sync", "words", "slots", "device", "kept", "held")

    def __init__(self, sync: Optional[torch.Tensor], words: int, slots: int,
                 device: torch.device, kept: bool) -> None:
        self.sync, self.words, self.slots, self.device, self.kept = (sync, words, slots,
                                                                      device, kept)
        self.held = None

    def __enter__(self) -> tuple[torch.Tensor, int, int]:
        if self.sync is not None:
            return self.sync, 0, 0
        held = _take_head(self.words, self.slots, self.device) if self.kept else None
        if held is None:
            return torch.zeros(self.words, dtype=torch.int32, device=self.device), 0, 0
        self.held = held
        return held.buf, held.tickets, 3 * held.launches

    def __exit__(self, exc_type, exc, tb) -> bool:
        held = self.held
        if held is not None:
            if exc_type is None:
                held.tickets += self.slots
                held.launches += 1
            held.lock.release()
        return False


def clear() -> None:
    """Drop every kept buffer (their memory returns to torch's caching allocator)."""
    _KEPT.clear()
    with _HEAD_LOCK:
        _HEADS.clear()
