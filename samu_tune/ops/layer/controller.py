"""The SAMU controller and write normalisation in torch (the module's unfused path).

Same formula as :func:`samu_tune.ops.layer.reference.controller_reference`, written for speed:
one ``[B*L, 2M] x [2M, 2]`` matmul for both projections instead of concatenating the bias
coordinate onto x.  :func:`kernel_controls` is the same controller by the Triton kernels
(:mod:`samu_tune.ops.scan.controls`); the fused layer runs those kernels inside its own
autograd Function, from :func:`kernel_operands`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from samu_tune.ops.scan import controls as kernel_controller
from samu_tune.ops.layer.reference import SAMUParams, write_gamma


def arithmetic_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs (reference runs), else float32 (bf16/fp16 x included)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def unit_directions(params: SAMUParams, dtype: torch.dtype) -> torch.Tensor:
    """[2, 2M+1]: the phase and radial directions, each divided by max(|d|, 1e-12)."""
    d = torch.stack([params.phase_direction, params.radial_direction]).to(dtype)
    return d / torch.linalg.vector_norm(d, dim=1, keepdim=True).clamp_min(1e-12)


def kernel_operands(params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(dirs [2, 2M+1], scales [2]), fp32 contiguous, differentiable in the parameters: the
    unit directions and (tanh a_p, tanh a_r) / sqrt(M), what the controller kernels read."""
    dirs = unit_directions(params, torch.float32).contiguous()
    amp = torch.stack([params.phase_amplitude, params.radial_amplitude]).to(torch.float32)
    return dirs, torch.tanh(amp) * (1.0 / math.sqrt(params.modes))


def kernel_controls(x: torch.Tensor, params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`controls` by the controller kernels (x on CUDA or under TRITON_INTERPRET=1, in
    bf16 / fp16 / fp32): (eta, delta) fp32, each x.shape[:-1]."""
    return kernel_controller.controls(x.contiguous(), *kernel_operands(params))


def controls(x: torch.Tensor, params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(eta, delta), each x.shape[:-1], in the arithmetic dtype; ``x`` is [..., 2M]."""
    cd = arithmetic_dtype(x)
    M = params.modes
    d = unit_directions(params, cd)                              # [2, 2M+1]
    q = F.linear(x.to(cd), d[:, :2 * M], d[:, 2 * M])            # [..., 2]
    s = torch.tanh(q)
    amp = torch.tanh(torch.stack([params.phase_amplitude, params.radial_amplitude]).to(cd))
    scale = 1.0 / math.sqrt(M)
    delta = amp[0] * s[..., 0] * scale
    r = s[..., 1]
    eta = amp[1] * r / (1.0 + r * r) * scale
    return eta, delta


def writes(x: torch.Tensor, params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(br, bi), each [..., M] in x's dtype: ``x[..., :M] * gamma``, ``x[..., M:] * gamma``."""
    cd = arithmetic_dtype(x)
    M = params.modes
    gamma = write_gamma(params.nu_log.to(cd))
    xc = x.to(cd)
    return (xc[..., :M] * gamma).to(x.dtype), (xc[..., M:] * gamma).to(x.dtype)
