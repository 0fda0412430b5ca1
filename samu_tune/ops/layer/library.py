"""The fused SAMU layer as the operators ``samu_tune::layer_fwd`` / ``layer_bwd`` (see
:mod:`samu_tune.library`)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from samu_tune import autograd as _grads
from samu_tune.library import F32 as _F32, operator, owned, strategy_arg, strategy_string
from samu_tune.ops.scan.library import TABLE_COLS


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
    """The fused SAMU layer backward: [grad dirs, grad scales, grad nu_log, grad theta_log,
    grad x, grad gamma, grad h0_r, grad h0_i (empty [0] without h0)]."""
    from samu_tune.ops.layer import fused_autograd
    from samu_tune.ops.scan.strategies import lookback
    cfg = _layer_config(x, segment_pos, h0_r is not None, scan_strategy, True)
    T = x.numel() // x.shape[-1]
    c = ctl_buf[:, :T]
    ctx = _grads.OpContext(
        (segment_pos, dirs, scales, c[0], c[1], c[2:], nu_log, theta_log, x, gamma, h0_r, h0_i,
         h_r, h_i, table),
        plan=lookback.LookbackPlan.of(cfg), dtypes=_grads.dtypes(h0_r, h0_i))
    grads = fused_autograd.FusedLayer.backward(ctx, d_y, d_last_r, d_last_i)[2:]
    grads = [g if g is not None else x.new_empty(0, dtype=_F32) for g in grads]
    return list(owned(tuple(grads), (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i,
                                      segment_pos, ctl_buf, h_r, h_i, table)))


@layer_bwd.register_fake
def _layer_bwd_fake(d_y, d_last_r, d_last_i, x, dirs, scales, gamma, nu_log, theta_log, h0_r,
                    h0_i, segment_pos, ctl_buf, h_r, h_i, table, scan_strategy):
    h0 = ([torch.empty_like(h0_r), torch.empty_like(h0_i)] if h0_r is not None
          else [x.new_empty(0, dtype=_F32), x.new_empty(0, dtype=_F32)])
    return [torch.empty_like(dirs), torch.empty_like(scales), torch.empty_like(nu_log),
            torch.empty_like(theta_log), torch.empty_like(x), torch.empty_like(gamma), *h0]


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
    g = torch.ops.samu_tune.layer_bwd(d_y, d_last_r, d_last_i, x, dirs, scales, gamma, nu_log,
                                      theta_log, h0_r, h0_i, seg, buf, h_r, h_i, table,
                                      ctx.scan_strategy)
    g_dirs, g_scales, g_nu, g_theta, g_x, g_gamma = g[:6]
    gh0 = (g[6], g[7]) if h0_r is not None else (None, None)
    return (g_x, g_dirs, g_scales, g_gamma, g_nu, g_theta, *gh0, None, None, None)


layer_fwd.register_autograd(_layer_backward, setup_context=_layer_setup)


def fused_layer(x: Tensor, dirs: Tensor, scales: Tensor, gamma: Tensor, nu_log: Tensor,
                theta_log: Tensor, seg: Optional[Tensor], h0, scan_strategy="auto"):
    """The fused layer through the operators (traceable): (y, (last_r, last_i))."""
    h0_r, h0_i = h0 if h0 is not None else (None, None)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i))
    y, last_r, last_i, *_ = torch.ops.samu_tune.layer_fwd(
        x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i, seg, needs_grad,
        strategy_string(scan_strategy))
    return y, (last_r, last_i)


