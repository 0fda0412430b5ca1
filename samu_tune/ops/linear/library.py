"""The generic real / complex scans as the operators ``samu_tune::linear_fwd`` / ``linear_bwd``
(see :mod:`samu_tune.library`)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from samu_tune.library import F32 as _F32, operator, owned, strategy_arg, strategy_string


def _linear_choice(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse: bool, needs_grad: bool,
                   strategy: str):
    from samu_tune.ops.linear import scan as ls
    h0 = None if h0_r is None else ls.Pair(h0_r, h0_i)
    name, cfg = ls.choice(ls.Pair(a_r, a_i), ls.Pair(b_r, b_i), h0, reverse,
                          strategy_arg(strategy), needs_grad)
    if name == "reference":
        raise NotImplementedError("the linear-scan operators run the serial / chunk kernels; "
                                  "the reference runs as traced torch code")
    return cfg


@operator("linear_fwd")
def linear_fwd(a_r: Tensor, a_i: Optional[Tensor], b_r: Tensor, b_i: Optional[Tensor],
               h0_r: Optional[Tensor], h0_i: Optional[Tensor], reverse: bool,
               needs_grad: bool, strategy: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``h[t] = a[t] h[t-1] + b[t]`` (complex when a_i is given) over [B, L, D]: (out_r,
    out_i [B, L, D] in b's dtype, last_r, last_i fp32 [B, D]; the imaginary parts empty [0]
    for a real scan)."""
    from samu_tune.ops.linear import launch
    cfg = _linear_choice(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad, strategy)
    h0 = None if h0_r is None else launch.Pair(h0_r, h0_i)
    out, last, _ = launch.run(cfg, reverse=reverse, adjoint=False, a=launch.Pair(a_r, a_i),
                              x=launch.Pair(b_r, b_i), h0=h0, out_dtype=b_r.dtype)
    outs = (out.r, out.i if out.i is not None else b_r.new_empty(0), last.r,
            last.i if last.i is not None else b_r.new_empty(0, dtype=_F32))
    return owned(outs, (a_r, a_i, b_r, b_i, h0_r, h0_i))


@linear_fwd.register_fake
def _linear_fwd_fake(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad, strategy):
    B, L, D = a_r.shape
    complex_ = a_i is not None
    return (torch.empty_like(b_r), torch.empty_like(b_r) if complex_ else b_r.new_empty(0),
            b_r.new_empty((B, D), dtype=_F32),
            b_r.new_empty((B, D), dtype=_F32) if complex_ else b_r.new_empty(0, dtype=_F32))


@operator("linear_bwd")
def linear_bwd(g_out_r: Optional[Tensor], g_out_i: Optional[Tensor],
               g_last_r: Optional[Tensor], g_last_i: Optional[Tensor], a_r: Tensor,
               a_i: Optional[Tensor], out_r: Tensor, out_i: Optional[Tensor],
               h0_r: Optional[Tensor], h0_i: Optional[Tensor], reverse: bool,
               strategy: str) -> list[Tensor]:
    """The linear scan's backward (the adjoint scan in the other direction): [grad a_r,
    grad a_i, grad b_r, grad b_i, grad h0_r, grad h0_i] (absent parts empty [0])."""
    from samu_tune.ops.linear import launch
    complex_ = a_i is not None
    cfg = _linear_choice(a_r, a_i, out_r, out_i, h0_r, h0_i, reverse, True, strategy)
    B, L, D = out_r.shape

    def dense(g, like):
        return torch.zeros_like(like) if g is None else g.contiguous()
    x = launch.Pair(dense(g_out_r, out_r), dense(g_out_i, out_r) if complex_ else None)
    h0_in = None
    if g_last_r is not None or g_last_i is not None:
        zero = out_r.new_zeros(B, D, dtype=_F32)
        h0_in = launch.Pair(dense(g_last_r, zero), dense(g_last_i, zero) if complex_ else None)
    f0 = None if h0_r is None else launch.Pair(h0_r, h0_i)
    grad_b, grad_h0, grad_a = launch.run(
        cfg, reverse=not reverse, adjoint=True, a=launch.Pair(a_r, a_i), x=x, h0=h0_in,
        out_dtype=out_r.dtype, f=launch.Pair(out_r, out_i if complex_ else None), f0=f0,
        grad_a_dtype=a_r.dtype)
    def empty():
        return out_r.new_empty(0)
    gh0_r = grad_h0.r.to(h0_r.dtype) if h0_r is not None else empty()
    gh0_i = grad_h0.i.to(h0_i.dtype) if h0_r is not None and complex_ else empty()
    outs = (grad_a.r, grad_a.i if complex_ else empty(), grad_b.r,
            grad_b.i if complex_ else empty(), gh0_r, gh0_i)
    return list(owned(outs, (a_r, a_i, out_r, out_i, h0_r, h0_i)))


@linear_bwd.register_fake
def _linear_bwd_fake(g_out_r, g_out_i, g_last_r, g_last_i, a_r, a_i, out_r, out_i, h0_r,
                     h0_i, reverse, strategy):
    complex_ = a_i is not None

    def empty():
        return out_r.new_empty(0)
    return [torch.empty_like(a_r), torch.empty_like(a_i) if complex_ else empty(),
            torch.empty_like(out_r), torch.empty_like(out_r) if complex_ else empty(),
            torch.empty_like(h0_r) if h0_r is not None else empty(),
            torch.empty_like(h0_i) if h0_r is not None and complex_ else empty()]


def _linear_setup(ctx, inputs, output):
    a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad, strategy = inputs
    out_r, out_i, _, _ = output
    ctx.save_for_backward(a_r, a_i, out_r, out_i if a_i is not None else None, h0_r, h0_i)
    ctx.args = (reverse, strategy)


def _linear_backward(ctx, g_out_r, g_out_i, g_last_r, g_last_i):
    a_r, a_i, out_r, out_i, h0_r, h0_i = ctx.saved_tensors
    if a_i is None:
        g_out_i = g_last_i = None
    g = linear_bwd(g_out_r, g_out_i, g_last_r, g_last_i, a_r, a_i, out_r, out_i, h0_r, h0_i,
                   *ctx.args)
    complex_ = a_i is not None
    has_h0 = h0_r is not None
    return (g[0], g[1] if complex_ else None, g[2], g[3] if complex_ else None,
            g[4] if has_h0 else None, g[5] if has_h0 and complex_ else None, None, None, None)


linear_fwd.register_autograd(_linear_backward, setup_context=_linear_setup)


def linear_scan(a_r, a_i, b_r, b_i, h0_r, h0_i, *, reverse: bool, strategy="auto"):
    """The linear scan through the operators (traceable): (out_r, out_i, last_r, last_i)."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (a_r, a_i, b_r, b_i, h0_r, h0_i))
    return linear_fwd(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad,
                      strategy_string(strategy))
