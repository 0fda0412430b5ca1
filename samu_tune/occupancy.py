"""How many programs of a compiled kernel the device runs at once: the grid of a persistent
kernel, whose programs take their work from a ticket counter until it runs out.

The count is the CUDA occupancy calculator's blocks per SM for the kernel's registers, shared
memory and warps (``cuOccupancyMaxActiveBlocksPerMultiprocessor`` of the driver, read through
ctypes: torch has no binding), times the SMs.  Fewer programs than that leave SMs idle; more
wait for a slot that frees only when the tickets have run out, and then start only to find
none.  Where the driver cannot answer (no libcuda, a kernel object without a loaded function),
the count is an estimate from shared memory alone, and None where even that is unknown: the
caller then launches a program per work item, which is correct too.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch

# shared memory an SM offers blocks (sm_80: 164 KB; sm_90: 228 KB) when torch does not say,
# and what the driver reserves per block (1 KB from sm_80 on)
_SMEM_PER_SM = {(8, 0): 164 * 1024, (9, 0): 228 * 1024}
_SMEM_RESERVED = 1024


@functools.lru_cache(maxsize=1)
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def blocks_per_sm(function: int, threads: int, shared: int) -> Optional[int]:
    """The driver's resident blocks per SM of a loaded ``CUfunction`` (an int handle) launched
    with ``threads`` per block and ``shared`` bytes of dynamic shared memory, or None."""
    fn = _libcuda()
    if fn is None or not function:
        return None
    n = ctypes.c_int(0)
    if fn(ctypes.byref(n), ctypes.c_void_p(function), threads, shared) != 0:
        return None
    return n.value if n.value > 0 else None


def resident_programs(kernel, device: torch.device) -> Optional[int]:
    """Programs of ``kernel`` (Triton's compiled kernel: ``function``, ``metadata.num_warps``,
    ``metadata.shared``) that ``device`` runs at once, or None where unknown: also where
    ``device`` is not a GPU (a compile worker of :mod:`samu_tune.compile_pool` launches on CPU
    tensors, every launch compile-only, and goes on to the next kernel of the candidate)."""
    if torch.device(device).type != "cuda":
        return None
    meta = getattr(kernel, "metadata", None)
    warps = getattr(meta, "num_warps", None)
    shared = getattr(meta, "shared", None)
    if warps is None or shared is None:
        return None
    props = torch.cuda.get_device_properties(device)
    per_sm = blocks_per_sm(getattr(kernel, "function", None), 32 * warps, shared)
    if per_sm is None:
        smem = getattr(props, "shared_memory_per_multiprocessor", None) or _SMEM_PER_SM.get(
            (props.major, props.minor))
        if smem is None:
            return None
        per_sm = max(1, smem // (shared + _SMEM_RESERVED))
    return per_sm * props.multi_processor_count


class PersistentGrid:
    """The grid of a persistent kernel, per specialisation and device: a program per work
    item on a specialisation's first launch, whose compiled kernel then says how many
    programs the device runs at once (:func:`resident_programs`), and at most that many
    after.  A specialisation is the identity of its keyword dict (memoized by the caller and
    never changed; kept here, so the identity stays its own)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        # (id of the keywords, device index) -> (the keywords, programs at once or None)
        self._kept: dict[tuple[int, int], tuple[dict, Optional[int]]] = {}

    def launch(self, kernel, items: int, args: tuple, kwargs: dict, tensor: torch.Tensor):
        """``kernel.launch((programs,), args, kwargs)`` (a :class:`samu_tune.launcher.
        FastKernel`) for ``items`` work items on ``tensor``'s device."""
        key = (id(kwargs), tensor.get_device())
        kept = self._kept.get(key)
        known = kept is not None and kept[0] is kwargs
        grid = min(items, kept[1]) if known and kept[1] is not None else items
        compiled = kernel.launch((grid,), args, kwargs)
        if not known:
            self._kept[key] = (kwargs, resident_programs(compiled, tensor.device))
        return compiled
