"""Whether the Triton kernels take a tensor's device: CUDA; the CPU under TRITON_INTERPRET=1;
the CPU of a compile worker (:mod:`samu_tune.compile_pool`), whose launches compile for the
GPU's target and return without running, so that the ops' kernel paths build there the
binaries a GPU run of the same call loads."""
from __future__ import annotations

import torch

from samu_tune.settings import settings

# set in a compile worker, for good
_COMPILE_ONLY = [False]


def set_compile_only() -> None:
    """Mark this process a compile worker."""
    _COMPILE_ONLY[0] = True


def runs_kernels(t: torch.Tensor) -> bool:
    """Whether Triton kernels take ``t``'s device (module docstring)."""
    return t.is_cuda or (t.device.type == "cpu" and (_COMPILE_ONLY[0] or settings().interpret))
