"""Output allocation shared by the Triton strategies.

With ``SAMU_TUNE_POISON=1`` every buffer is filled with NaN first, so an element a kernel
forgot to write fails the comparison with the reference instead of passing by luck.
"""
from __future__ import annotations

import torch

from ..settings import settings


def empty(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if settings().poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return empty(*t.shape, dtype=dtype or t.dtype, device=t.device)
