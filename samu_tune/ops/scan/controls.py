"""The SAMU controller's kernels (:mod:`samu_tune.kernels.controller`) bound to torch.

Not a scan strategy (nothing is registered): the launches are shared by the fused layer
(:class:`samu_tune.ops.layer.fused_autograd.FusedLayer` runs them inside its own forward and
backward: the controller backward then adds its grad x into the scan's in place) and by
:class:`_Controller`, the controller alone as an autograd Function (x, unit directions,
amplitude scales) -> (eta, delta), which tests it against the float64 reference.

The operands are what the kernels read: ``dirs`` [2, 2M + 1] fp32, the unit phase and radial
directions; ``scales`` [2] fp32, (tanh a_p, tanh a_r) / sqrt(M).  The SAMU layer builds them
from its raw parameters by the operands kernel (:mod:`samu_tune.ops.layer.operands`; in torch
under torch.compile, :func:`samu_tune.ops.layer.controller.kernel_operands`), or lets the
forward kernel build them as it runs (:func:`forward`'s ``raw``: the fused layer's training
forward).
"""
from __future__ import annotations

import functools
import math

from typing import NamedTuple, Optional

import torch

from samu_tune import intmath
from samu_tune.kernels import controller as kernels
from samu_tune.kernels import controls as control_kernels
from samu_tune import alloc as _alloc, autograd as _grads
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import fast

# the controller kernels, launched directly after their first launch per specialisation
_forward_kernel = fast(kernels.controller_forward)
_backward_kernel = fast(kernels.controller_backward)

# Tiles, chosen by ptxas for sm_90 (bf16 x, K a multiple of 16: x and grad x move in 16-byte
# vectors): forward [16, 128] and backward [32, 64] at 4 warps, no spills, far fewer
# registers than [32, 128] tiles (register counts: docs/performance.md).  Backward programs
# along the tokens are sized so that a launch has about _BWD_PROGRAMS programs (5 fit an SM
# by registers: about one wave on 132 SMs), which keeps the partials small
# ([n, 2, 2M + 2] fp32, n <= _BWD_PROGRAMS / column tiles).
_FWD_BLOCK_T, _FWD_BLOCK_K = 16, 128
# the raw forward's normalisation: the operands kernel's block and warps (the same reduction,
# so that both give bitwise the same unit directions: samu_tune.ops.layer.operands)
RAW_BLOCK = 512
_BWD_BLOCK_T, _BWD_BLOCK_K = 32, 64
NUM_WARPS = 4
_BWD_PROGRAMS = 640


X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OWNER = "controller kernels"


def check_tensor(owner: str, what: str, t: torch.Tensor, shape: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device, per_token: bool = False) -> None:
    """Raise ValueError (naming ``owner`` and ``what``) unless ``t`` is contiguous with
    ``shape`` (``per_token``: any shape of shape[0] = T elements), ``dtype`` and ``device``:
    kernels index their operands by T, K or M unchecked."""
    fits = t.numel() == shape[0] if per_token else tuple(t.shape) == shape
    if not fits or t.dtype != dtype or t.device != device or not t.is_contiguous():
        raise ValueError(f"{owner}: {what} must be contiguous {list(shape)} "
                         f"{dtype} on {device}, got {'' if t.is_contiguous() else 'strided '}"
                         f"{list(t.shape)} {t.dtype} on {t.device}")


def _check_operands(x: torch.Tensor, dirs: torch.Tensor, scales: torch.Tensor) -> None:
    """x [..., K] (contiguous, bf16 / fp16 / fp32), dirs [2, K + 1], scales [2] fp32."""
    if x.dim() == 0 or x.shape[-1] == 0 or x.dtype not in X_DTYPES or not x.is_contiguous():
        raise ValueError(f"{_OWNER}: x must be a contiguous [..., 2M] tensor in "
                         f"bf16 / fp16 / fp32, got {list(x.shape)} {x.dtype}"
                         f"{'' if x.is_contiguous() else ' (strided)'}")
    K = x.shape[-1]
    check_tensor(_OWNER, "dirs", dirs, (2, K + 1), torch.float32, x.device)
    check_tensor(_OWNER, "scales", scales, (2,), torch.float32, x.device)


@functools.lru_cache(maxsize=256)
def _forward_meta(table: bool, resets: bool, K: int, raw: bool = False) -> dict:
    """The forward launch's keywords, one dict per signature (never changed: it keys the
    direct launch, :meth:`samu_tune.launcher.FastKernel.launch`)."""
    return dict(HAS_TABLE=table, HAS_RESETS=resets, BLOCK_T=_FWD_BLOCK_T,
                BLOCK_K=_block_k(K, _FWD_BLOCK_K), K_ALIGN=_k_align(K), RAW=raw,
                RAW_BLOCK=RAW_BLOCK, num_warps=NUM_WARPS, **LAUNCH_OPTIONS)


@functools.lru_cache(maxsize=256)
def _backward_meta(accumulate: bool, block_k: int, K: int) -> dict:
    """The backward launch's keywords, as :func:`_forward_meta`."""
    return dict(ACCUMULATE=accumulate, BLOCK_T=_BWD_BLOCK_T, BLOCK_K=block_k,
                K_ALIGN=_k_align(K), num_warps=NUM_WARPS, **LAUNCH_OPTIONS)


@functools.lru_cache(maxsize=256)
def _backward_grid(T: int, K: int) -> tuple[int, int, int, int]:
    """(BLOCK_K, column tiles, tokens per program, token groups) of a backward launch."""
    block_k = _block_k(K, _BWD_BLOCK_K)
    col_tiles = intmath.cdiv(K, block_k)
    per = intmath.cdiv(T, max(1, _BWD_PROGRAMS // col_tiles))
    tokens_per_program = intmath.cdiv(per, _BWD_BLOCK_T) * _BWD_BLOCK_T
    return block_k, col_tiles, tokens_per_program, intmath.cdiv(T, tokens_per_program)


def _block_k(K: int, most: int) -> int:
    return min(most, max(16, intmath.next_power_of_2(K)))


def _k_align(K: int) -> int:
    """The kernels' K_ALIGN: 8 when 2M is a multiple of 8 (16-byte row vectors), else 1."""
    return 8 if K % 8 == 0 else 1


class Controls(NamedTuple):
    """The controller forward's outputs: eta, delta [T], s ([2, T]: tanh q_p and r = tanh q_r,
    what backward reads), rows of one fp32 [4, T] allocation whose rows start 16-byte aligned
    whatever T (Triton specialises pointers on 16-byte alignment: one binary for every T),
    and the scan's control table ([T, 4] fp32, :mod:`samu_tune.kernels.controls`) or None."""

    eta: torch.Tensor
    delta: torch.Tensor
    s: torch.Tensor
    table: Optional[torch.Tensor]


def forward(x: torch.Tensor, dirs: torch.Tensor, scales: torch.Tensor, *,
            table: bool = False, seg: Optional[torch.Tensor] = None,
            checked: bool = True, raw: Optional[tuple] = None) -> Controls:
    """The controls of the tokens of ``x`` [..., K] (contiguous), flattened to T = x.numel()
    / K; with ``table`` also the scan's control table (``seg`` [T] resets, or None).
    ValueError on operands of other shapes, dtypes or devices (:func:`_check_operands`);
    ``checked=False``: the caller built or checked every operand (no checks: host time).
    ``raw``: the SAMU layer's (pd, rd, pa, ra, nu_log, gamma) (fp32 contiguous, unchecked):
    the kernel normalises the raw parameters itself and writes the operands into ``dirs``,
    ``scales`` and ``gamma`` (the RAW mode of
    :func:`samu_tune.kernels.controller.controller_forward`: no operands launch)."""
    if checked and raw is None:
        _check_operands(x, dirs, scales)
    K = x.shape[-1]
    T = x.numel() // K
    if checked and seg is not None and (
            seg.numel() != T or seg.device != x.device or seg.is_floating_point()
            or not seg.is_contiguous()):
        raise ValueError(f"{_OWNER}: seg must be contiguous integers, one per token "
                         f"({T}) on {x.device}, got {list(seg.shape)} {seg.dtype}")
    stride = intmath.cdiv(T, 4) * 4
    buf = _alloc.empty(4 * stride, dtype=torch.float32, device=x.device)     # rows [4, T]
    ctl = (_alloc.empty(T, control_kernels.TABLE_COLS.value, dtype=torch.float32,
                       device=x.device) if table else None)
    pd, rd, pa, ra, nu_log, gamma = raw if raw is not None else (None,) * 6
    M = 0 if nu_log is None else nu_log.numel()
    _forward_kernel.launch((intmath.cdiv(T, _FWD_BLOCK_T),), (
        x, dirs, scales, buf, stride, ctl, seg, pd, rd, pa, ra, nu_log, gamma, T, K, M,
        1.0 / math.sqrt(max(M, 1))), _forward_meta(table, seg is not None, K, raw is not None))
    # as_strided views: a fraction of indexing's host time
    return Controls(buf.as_strided((T,), (1,), 0), buf.as_strided((T,), (1,), stride),
                    buf.as_strided((2, T), (stride, 1), 2 * stride), ctl)


def backward(x: torch.Tensor, dirs: torch.Tensor, scales: torch.Tensor, s: torch.Tensor,
             d_eta: torch.Tensor, d_delta: torch.Tensor,
             grad_x: Optional[torch.Tensor] = None, checked: bool = True, whole: bool = False
             ) -> tuple[torch.Tensor, ...]:
    """(grad x, grad dirs [2, K + 1], grad scales [2]) from fp32 contiguous ``d_eta``,
    ``d_delta`` (T elements each) and forward's ``s``; ``whole``: (grad x, both as one
    contiguous fp32 [2, K + 2], grad dirs its first K + 1 columns, grad scales the last).
    ``grad_x`` given (contiguous, x's shape and dtype): the controller's grad x is added into
    it in place (no extra pass over [T, K]); else a fresh one in x's dtype.  The partials are
    summed in a fixed order (deterministic).  ValueError on operands of other shapes, dtypes
    or devices."""
    K = x.shape[-1]
    T = x.numel() // K
    if checked:
        _check_operands(x, dirs, scales)
        for what, t in (("s[0]", s[0]), ("s[1]", s[1]), ("d_eta", d_eta), ("d_delta", d_delta)):
            check_tensor(_OWNER, what, t, (T,), torch.float32, x.device, per_token=True)
        if grad_x is not None:
            check_tensor(_OWNER, "grad_x", grad_x, tuple(x.shape), x.dtype, x.device)
    block_k, col_tiles, tokens_per_program, groups = _backward_grid(T, K)
    accumulate = grad_x is not None
    if grad_x is None:
        grad_x = _alloc.empty_like(x)
    extra = kernels.PARTIAL_EXTRA.value
    partials = _alloc.empty(groups, 2, K + extra, dtype=torch.float32, device=x.device)
    _backward_kernel.launch((groups, col_tiles), (
        x, dirs, scales, s, s.stride(0), d_eta, d_delta, grad_x, partials, T, K,
        tokens_per_program), _backward_meta(accumulate, block_k, K))
    total = partials[0] if groups == 1 else partials.sum(0)                       # [2, K + 2]
    return (grad_x, total) if whole else (grad_x, *dirs_and_scales(total))


def dirs_and_scales(total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad dirs [2, K + 1], grad scales [2]): views of the controller's summed gradients
    ``total`` [2, K + 2] (:func:`backward` with ``whole``)."""
    K1 = total.shape[1] - 1
    return total[:, :K1], total[:, K1]


class _Controller(torch.autograd.Function):
    """(x [..., 2M], dirs [2, 2M + 1], scales [2]) -> (eta, delta), each x.shape[:-1] fp32."""

    @staticmethod
    def forward(ctx, x, dirs, scales):
        c = forward(x, dirs, scales)
        ctx.save_for_backward(x, dirs, scales, c.s)
        lead = x.shape[:-1]
        return c.eta.view(lead), c.delta.view(lead)

    @staticmethod
    def backward(ctx, d_eta, d_delta):
        x, dirs, scales, s = ctx.saved_tensors
        f32 = torch.float32
        return backward(x, dirs, scales, s, d_eta.to(f32).contiguous(),
                        d_delta.to(f32).contiguous())


def controls(x: torch.Tensor, dirs: torch.Tensor, scales: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(eta, delta) of ``x`` [..., 2M] by the controller kernels, differentiable in x, dirs
    and scales (all contiguous; dirs and scales fp32)."""
    return _grads.apply(_Controller, x, dirs, scales)
