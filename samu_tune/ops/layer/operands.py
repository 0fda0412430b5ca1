"""The SAMU layer's parameter operands by one kernel (:mod:`samu_tune.kernels.operands`).

``operands(phase_direction, radial_direction, phase_amplitude, radial_amplitude, nu_log)``
-> (dirs [2, 2M + 1], scales [2], gamma [M]), fp32, differentiable: one launch forward and
one backward, where the same formula in torch (:func:`samu_tune.ops.layer.fused.operands_torch`)
is about a dozen kernels forward and twenty in backward, each a few microseconds of host time.
All parameters fp32 on one device (CUDA, or the CPU under the Triton interpreter).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from samu_tune import intmath
from samu_tune.kernels import operands as kernels
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import fast
from samu_tune import alloc as _alloc, autograd as _grads
from samu_tune.ops.scan import controls

# launched directly after their first launch per specialisation
_forward_kernel = fast(kernels.layer_operands)
_backward_kernel = fast(kernels.layer_operands_backward)

# the controller's raw forward normalises with the same block and warps (bitwise the same
# unit directions whichever kernel computes them)
_BLOCK = controls.RAW_BLOCK
_NUM_WARPS = controls.NUM_WARPS
# the launches' keywords, never changed (they key the direct launch by identity)
_FORWARD_META = dict(BLOCK=_BLOCK, num_warps=_NUM_WARPS, **LAUNCH_OPTIONS)
_BACKWARD_META = {has: dict(BLOCK=_BLOCK, HAS_NU_IN=has, num_warps=_NUM_WARPS, **LAUNCH_OPTIONS)
                  for has in (False, True)}


def _layout(K1: int, M: int) -> tuple[int, int, int]:
    """Word offsets of dirs, scales and gamma in one fp32 buffer (each 16-byte aligned)."""
    scales = intmath.cdiv(2 * K1, 4) * 4
    gamma = scales + 4
    return scales, gamma, gamma + intmath.cdiv(M, 4) * 4


def _grid(M: int) -> tuple[int]:
    return (2 + intmath.cdiv(M, _BLOCK),)


def compute(pd: torch.Tensor, rd: torch.Tensor, pa: torch.Tensor, ra: torch.Tensor,
            nu_log: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dirs [2, K1], scales [2], gamma [M]) of contiguous fp32 parameters, no autograd: one
    launch into one buffer."""
    K1, M = pd.numel(), nu_log.numel()
    dirs, scales, gamma = empty(K1, M, pd.device)
    _forward_kernel.launch(_grid(M), (pd, rd, pa, ra, nu_log, dirs, scales, gamma, K1, M,
                                      1.0 / math.sqrt(M)), _FORWARD_META)
    return dirs, scales, gamma


def empty(K1: int, M: int, device: torch.device
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised (dirs [2, K1], scales [2], gamma [M]) fp32, views of one allocation: what
    :func:`compute` (or the controller's raw forward) writes."""
    at_scales, at_gamma, total = _layout(K1, M)
    buf = _alloc.empty(total, dtype=torch.float32, device=device)
    return (buf[:2 * K1].view(2, K1), buf[at_scales:at_scales + 2],
            buf[at_gamma:at_gamma + M])


def backward(pd: torch.Tensor, rd: torch.Tensor, pa: torch.Tensor, ra: torch.Tensor,
             nu_log: torch.Tensor, g_dirs: torch.Tensor, g_scales: torch.Tensor,
             g_gamma: torch.Tensor, g_nu_in: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, ...]:
    """(grad pd, grad rd, grad pa, grad ra, grad nu_log) from the gradients of dirs [2, K1]
    (rows at any stride, unit-stride within a row), scales [2] (any stride) and gamma [M];
    ``g_nu_in`` [M] (contiguous fp32): a further gradient of nu_log added in (the scan's)."""
    K1, M = pd.numel(), nu_log.numel()
    k1w = intmath.cdiv(K1, 4) * 4
    buf = _alloc.empty(2 * k1w + 4 + intmath.cdiv(M, 4) * 4, dtype=torch.float32,
                       device=pd.device)
    g_pd, g_rd = buf[:K1], buf[k1w:k1w + K1]
    g_pa, g_ra = buf[2 * k1w], buf[2 * k1w + 1]
    g_nu = buf[2 * k1w + 4:2 * k1w + 4 + M]
    # the controller's backward hands over row views of its summed partials: read with their
    # strides (a copy each would cost a launch)
    if g_dirs.stride(-1) != 1:
        g_dirs = g_dirs.contiguous()
    _backward_kernel.launch(_grid(M), (
        pd, rd, pa, ra, nu_log, g_dirs, g_dirs.stride(0), g_scales, g_scales.stride(0),
        g_gamma.contiguous(), g_nu_in, g_pd, g_rd, g_pa, g_ra, g_nu, K1, M, 1.0 / math.sqrt(M)),
        _BACKWARD_META[g_nu_in is not None])
    return g_pd, g_rd, g_pa, g_ra, g_nu


class _Operands(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pd, rd, pa, ra, nu_log):
        ctx.save_for_backward(pd, rd, pa, ra, nu_log)
        return compute(pd, rd, pa, ra, nu_log)

    @staticmethod
    def backward(ctx, g_dirs, g_scales, g_gamma):
        return backward(*ctx.saved_tensors, g_dirs, g_scales, g_gamma)


def operands(pd: torch.Tensor, rd: torch.Tensor, pa: torch.Tensor, ra: torch.Tensor,
             nu_log: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dirs [2, K1], scales [2], gamma [M]) of contiguous fp32 parameters pd, rd [K1],
    pa, ra (0-d), nu_log [M] (module docstring)."""
    return _grads.apply(_Operands, pd, rd, pa, ra, nu_log)
