"""Output allocation shared by the Triton strategies.

With ``SAMU_TUNE_POISON=1`` every buffer is filled with NaN first, so an element a kernel
forgot to write fails the comparison with the reference instead of passing by luck.
"""
from __future__ import annotations

import torch

from samu_tune.settings import settings


# the sizes passed as separate arguments and ``empty_like``: each ~0.4 us less host time
# than a shape tuple or a shape read from the tensor (development CPU)

def empty(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if settings().poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device) if shape else \
        torch.empty((), dtype=dtype, device=device)


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Uninitialised, contiguous, ``t``'s shape and device (and dtype unless given)."""
    if settings().poison:
        return torch.full(t.shape, float("nan"), dtype=dtype or t.dtype, device=t.device)
    return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)


def empty_strided(shape: tuple[int, ...], strides: tuple[int, ...], *, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    t = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    if settings().poison:
        t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0).fill_(
            float("nan"))
    return t
