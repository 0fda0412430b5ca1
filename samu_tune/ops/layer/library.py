"""The fused SAMU layer as the operators ``samu_tune::layer_fwd`` / ``layer_bwd`` (see
:mod:`samu_tune.library`)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from samu_tune import autograd as _grads
from samu_tune.library import F32 as _F32, operator, owned, strategy_arg, strategy_string
from samu_tune.kernels.controller import PARTIAL_EXTRA as _PARTIAL_EXTRA
from samu_tune.ops.scan.controls import dirs_and_scales
from samu_tune.ops.scan.library import TABLE_COLS
from samu_tune.ops.scan.grad_block import OperatorWork, grad_block_layout, packed, unpacked


def _layer_config(x: Tensor, seg: Optional[Tensor], has_state: bool, scan_strategy: str,
                  needs_grad: bool):
    """The fused layer's loop-inner config for this call: the eager path's choice, else (a
    sequence too short for the loop configs' pruning, met by a graph traced with symbolic
    sizes) the choice for 64 tokens of the same B and M: a loop walk is correct for any L
    (a chunk longer than L is one partial chunk)."""
    from samu_tune.ops.layer import fused
    strategy = strategy_arg(scan_strategy)
    cfg = fused.config_for(x, seg, has_state, strategy, needs_grad)
    if cfg is None:
        B, L, width = x.shape
        cfg = fused.config_for_call((B, max(L, 64), width), x.dtype, x.device, seg is not None,
                                    has_state, strategy, needs_grad)
    if cfg is None:
        raise ValueError(f"the fused SAMU layer cannot run x of shape {list(x.shape)} "
                         "(2M must exceed 128)")
    return cfg


@operator("layer_fwd")
def layer_fwd(x: Tensor, dirs: Tensor, scales: Tensor, gamma: Tensor, nu_log: Tensor,
              theta_log: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
              segment_pos: Optional[Tensor], needs_grad: bool, scan_strategy: str
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The fused SAMU layer forward (:class:`samu_tune.ops.layer.fused_autograd.FusedLayer`):
    (y [B, L, 2M] in x's dtype, last_r, last_i fp32 [B, M], and for backward: the
    controller's buffer fp32 [4, T4] (rows eta, delta, tanh q_p, r; T4 = B L rounded up to
    4), the states h_r, h_i [B, L, M] in x's dtype (empty [0] unless ``needs_grad``), the
    control table fp32 [B L, 4])."""
    from samu_tune.ops.layer import fused_autograd
    from samu_tune.ops.scan.strategies import lookback
    cfg = _layer_config(x, segment_pos, h0_r is not None, scan_strategy, needs_grad)
    ctx = _grads.OpContext(training=needs_grad)
    y, last_r, last_i = fused_autograd.FusedLayer.forward(
        ctx, lookback.LookbackPlan.of(cfg), segment_pos, dirs, scales, nu_log, theta_log, x,
        gamma, h0_r, h0_i)
    saved = ctx.saved_tensors
    c_eta, h_r, h_i, table = saved[3], saved[12], saved[13], saved[14]
    # eta, delta, s are the rows of one [4, T4] allocation (ops.scan.controls.forward)
    t4 = _t4(c_eta.numel())
    buf = c_eta.as_strided((4, t4), (t4, 1), c_eta.storage_offset())
    if h_r is None:
        h_r, h_i = x.new_empty(0), x.new_empty(0)
    return owned((y, last_r, last_i, buf, h_r, h_i, table),
                  (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, segment_pos))


def _t4(T):
    return ((T + 3) // 4) * 4


@layer_fwd.register_fake
def _layer_fwd_fake(x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, segment_pos,
                    needs_grad, scan_strategy):
    B, L, width = x.shape
    M = width // 2
    T = B * L
    h = ((x.new_empty((B, L, M)), x.new_empty((B, L, M))) if needs_grad
         else (x.new_empty(0), x.new_empty(0)))
    return (torch.empty_like(x), x.new_empty((B, M), dtype=_F32),
            x.new_empty((B, M), dtype=_F32), x.new_empty((4, _t4(T)), dtype=_F32), *h,
            x.new_empty((T, TABLE_COLS), dtype=_F32))


@operator("layer_bwd")
def layer_bwd(d_y: Optional[Tensor], d_last_r: Optional[Tensor], d_last_i: Optional[Tensor],
              x: Tensor, dirs: Tensor, scales: Tensor, gamma: Tensor, nu_log: Tensor,
              theta_log: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
              segment_pos: Optional[Tensor], ctl_buf: Tensor, h_r: Tensor, h_i: Tensor,
              table: Tensor, scan_strategy: str) -> list[Tensor]:
    """The fused SAMU layer backward: [grad dirs and grad scales as one fp32 [2, 2M + 2]
    (dirs the first 2M + 1 columns), the gradient block (grad nu_log, theta_log, gamma at
    their offsets of :mod:`samu_tune.ops.scan.grad_block`), grad x, grad h0_r, grad h0_i
    (empty [0] without h0)]: the backward's buffers themselves, where outputs cut from one
    would each be a copy."""
    from samu_tune.ops.layer import fused_autograd
    from samu_tune.ops.scan.strategies import lookback
    cfg = _layer_config(x, segment_pos, h0_r is not None, scan_strategy, True)
    T = x.numel() // x.shape[-1]
    c = ctl_buf[:, :T]
    ctx = _grads.OpContext(
        (segment_pos, dirs, scales, c[0], c[1], c[2:], nu_log, theta_log, x, gamma, h0_r, h0_i,
         h_r, h_i, table),
        plan=lookback.LookbackPlan.of(cfg), dtypes=_grads.dtypes(h0_r, h0_i))
    B, L, width = x.shape
    # the look-back's accumulators zeroed as the gradient block itself (grad_block)
    work = ctx.work = (OperatorWork(ctx.plan, B, L, width // 2, x.device, fused=True)
                       if OperatorWork.serves(ctx.plan) else None)
    _, _, g_nu, g_theta, g_x, g_gamma, *gh0 = fused_autograd.FusedLayer.backward(
        ctx, d_y, d_last_r, d_last_i)[2:]
    block = (work.block if work is not None
             else packed((None, None, g_nu, g_theta, g_gamma), B, L, width // 2, fused=True))
    gh0 = [g if g is not None else x.new_empty(0, dtype=_F32) for g in gh0]
    return list(owned((ctx.dirs_block, block, g_x, *gh0),
                      (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, segment_pos,
                       ctl_buf, h_r, h_i, table)))


@layer_bwd.register_fake
def _layer_bwd_fake(d_y, d_last_r, d_last_i, x, dirs, scales, gamma, nu_log, theta_log, h0_r,
                    h0_i, segment_pos, ctl_buf, h_r, h_i, table, scan_strategy):
    B, L, width = x.shape
    h0 = ([torch.empty_like(h0_r), torch.empty_like(h0_i)] if h0_r is not None
          else [x.new_empty(0, dtype=_F32), x.new_empty(0, dtype=_F32)])
    return [x.new_empty((2, width + _PARTIAL_EXTRA.value), dtype=_F32),
            x.new_empty(grad_block_layout(B, L, width // 2, fused=True)[-1], dtype=_F32),
            torch.empty_like(x), *h0]


def _layer_setup(ctx, inputs, output):
    (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, seg, needs_grad,
     scan_strategy) = inputs
    _, _, _, buf, h_r, h_i, table = output
    ctx.save_for_backward(x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, seg, buf,
                          h_r, h_i, table)
    ctx.scan_strategy = scan_strategy


def _layer_backward(ctx, d_y, d_last_r, d_last_i, *_unused):
    x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, seg, buf, h_r, h_i, table = \
        ctx.saved_tensors
    g = layer_bwd(d_y, d_last_r, d_last_i, x, dirs, scales, gamma, nu_log, theta_log, h0_r,
                  h0_i, seg, buf, h_r, h_i, table, ctx.scan_strategy)
    dirs_block, block, g_x = g[:3]
    B, L, width = x.shape
    g_nu, g_theta, g_gamma = unpacked(block, B, L, width // 2, fused=True)[2:]
    gh0 = (g[3], g[4]) if h0_r is not None else (None, None)
    return (g_x, *dirs_and_scales(dirs_block), g_gamma, g_nu, g_theta, *gh0, None, None, None)


layer_fwd.register_autograd(_layer_backward, setup_context=_layer_setup)


def fused_layer(x: Tensor, dirs: Tensor, scales: Tensor, gamma: Tensor, nu_log: Tensor,
                theta_log: Tensor, seg: Optional[Tensor], h0, scan_strategy="auto"):
    """The fused layer through the operators (traceable): (y, (last_r, last_i))."""
    h0_r, h0_i = h0 if h0 is not None else (None, None)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i))
    y, last_r, last_i, *_ = layer_fwd(
        x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, seg, needs_grad,
        strategy_string(scan_strategy))
    return y, (last_r, last_i)


