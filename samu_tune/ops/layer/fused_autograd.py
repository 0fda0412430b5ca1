"""The fused SAMU layer's autograd Function: the controller kernels and the look-back scan
(loop inner) with the layer's write and ReLU output fused into the scan's loads and stores."""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune import autograd as _grads
from samu_tune.ops.scan import controls as controller
from samu_tune.ops.layer import operands as operand_kernels
from samu_tune.ops.scan.strategies import lookback as lb


class FusedLayer(torch.autograd.Function):
    """The SAMU layer: the controller kernels, then the scan with the write and the ReLU
    output fused (loop-inner look-back).

    Inputs: x [B, L, 2M] (bf16 / fp16 / fp32), the controller's dirs [2, 2M + 1] and scales
    [2] (:mod:`samu_tune.ops.scan.controls`), gamma [M], nu_log, theta_log [M] fp32, h0
    pair fp32 [B, M] or None; outputs y = relu(cat(Re h, Im h)) [B, L, 2M] in x's dtype and the
    final state (fp32 [B, M] pair), where h is the scan of the writes (x[..., :M] + i x[..., M:])
    gamma rounded to x's dtype (as the unfused layer's torch write), with the controls eta,
    delta of x.

    Forward: the controller kernel reads x once and writes the controls and the scan's
    control table (16 bytes a token); the scan reads x once and writes y (and, when a gradient
    is needed, the states h [B, L, M] pair in x's dtype).  Backward: the scan reads d y, h
    and x and writes grad x and the control gradients; the controller's backward kernel reads
    x and adds its grad x into the scan's in place.  The controller lives in this Function
    (not in a Function of its own) for that accumulation: two autograd Functions would each
    write a grad x and autograd would add them in a third pass over [B, L, 2M].
    """

    @staticmethod
    def forward(ctx, plan: lb.LookbackPlan, seg, dirs, scales, nu_log, theta_log, x, gamma, h0_r,
                h0_i):
        y, last_r, last_i, saved = _forward(ctx, plan, seg, dirs, scales, nu_log, theta_log, x,
                                            gamma, h0_r, h0_i)
        ctx.save_for_backward(*saved)
        return y, last_r, last_i

    @staticmethod
    def backward(ctx, d_y, d_last_r, d_last_i):
        g_dirs, g_scales, g_nu, g_theta, grad_x, g_gamma, gh0 = _backward(
            ctx, ctx.saved_tensors, d_y, d_last_r, d_last_i)
        return (None, None, g_dirs, g_scales, g_nu, g_theta, grad_x, g_gamma,
                *_cast(gh0, ctx.dtypes))


class FusedLayerParams(torch.autograd.Function):
    """:class:`FusedLayer` from the raw parameters: the controller's forward kernel computes
    the operands (unit directions, amplitude scales, gamma: :mod:`samu_tune.ops.layer.
    operands`) as it runs (two launches forward, not three) and the operands' backward kernel
    runs inside this Function's backward, which also adds nu_log's gradient through the scan
    into that through gamma.  One autograd node per layer call instead of two, and no add or
    copy launches between them (the eager training path).

    Inputs: plan, seg, the phase and radial directions [2M + 1], amplitudes (0-d), nu_log,
    theta_log [M] (all fp32 contiguous), x [B, L, 2M], h0 pair or None; outputs as
    :class:`FusedLayer`."""

    @staticmethod
    def forward(ctx, plan: lb.LookbackPlan, seg, pd, rd, pa, ra, nu_log, theta_log, x, h0_r,
                h0_i):
        # the operands written by the controller's forward from the raw parameters (no
        # launch of their own); x and seg checked by fused_layer_params: no controller checks
        dirs, scales, gamma = operand_kernels.empty(pd.numel(), nu_log.numel(), x.device)
        y, last_r, last_i, saved = _forward(ctx, plan, seg, dirs, scales, nu_log, theta_log, x,
                                            gamma, h0_r, h0_i, checked=False,
                                            raw=(pd, rd, pa, ra, nu_log, gamma))
        ctx.save_for_backward(*saved, pd, rd, pa, ra)
        return y, last_r, last_i

    @staticmethod
    def backward(ctx, d_y, d_last_r, d_last_i):
        saved = ctx.saved_tensors
        g_dirs, g_scales, g_nu, g_theta, grad_x, g_gamma, gh0 = _backward(
            ctx, saved[:_SAVED], d_y, d_last_r, d_last_i)
        nu_log = saved[6]
        g_pd, g_rd, g_pa, g_ra, g_nu = operand_kernels.backward(
            *saved[_SAVED:], nu_log, g_dirs, g_scales, g_gamma, g_nu.contiguous())
        return (None, None, g_pd, g_rd, g_pa, g_ra, g_nu, g_theta, grad_x,
                *_cast(gh0, ctx.dtypes))


# the tensors _forward saves, in order
_SAVED = 15


def _forward(ctx, plan: lb.LookbackPlan, seg, dirs, scales, nu_log, theta_log, x, gamma, h0_r,
             h0_i, checked: bool = True, raw: Optional[tuple] = None):
    """The layer forward's launches: (y, last_r, last_i, the tensors backward reads);
    ``checked=False``: the controller's operands need no checks (here and in backward);
    ``raw``: the controller writes dirs, scales and gamma from the raw parameters
    (:func:`samu_tune.ops.scan.controls.forward`)."""
    B, L, width = x.shape
    M = width // 2
    c = controller.forward(x, dirs, scales, table=True, seg=seg, checked=checked, raw=raw)
    y = torch.empty_like(x)
    last_r, last_i = _grads.pair(B, M, dtype=torch.float32, device=x.device)
    save = _grads.training(ctx)
    h_r, h_i = (_grads.pair(B, L, M, dtype=x.dtype, device=x.device) if save
                else (None, None))
    eager = not _grads.in_operator(ctx)
    # an operator's backward zeroes its own buffers (ctx.in_operator); an eager forward with
    # no backward to come takes the head kept for the stream (no zero fill)
    work = (None if not save and eager
            else lb._Zeroed.of(plan, B, L, M, x.device, save and eager, fused=True))
    lb._launch(plan, False, B, L, M, eta=c.eta, delta=c.delta, nu_log=nu_log,
               theta_log=theta_log, seg=seg, x=(x, None), h0=(h0_r, h0_i), y=(h_r, h_i),
               end=(last_r, last_i), ctl=c.table, gamma=gamma, o=y, save_h=save,
               sync=None if work is None else work.fwd_sync, kept=eager)
    ctx.plan = plan
    ctx.dtypes = _grads.dtypes(h0_r, h0_i)
    ctx.work = work
    ctx.checked = checked
    # an unused output's gradient stays None: no zero-filled buffers for the final state
    ctx.set_materialize_grads(False)
    return y, last_r, last_i, (seg, dirs, scales, c.eta, c.delta, c.s, nu_log, theta_log, x,
                               gamma, h0_r, h0_i, h_r, h_i, c.table)


def _backward(ctx, saved, d_y, d_last_r, d_last_i):
    """The layer backward's launches from :func:`_forward`'s saved tensors: fp32 (grad dirs,
    grad scales, grad nu_log through the scan, grad theta_log), grad x, grad gamma, and the
    grad h0 pair (fp32, or Nones)."""
    (seg, dirs, scales, eta, delta, s, nu_log, theta_log, x, gamma, h0_r, h0_i, h_r, h_i,
     ctl) = saved
    plan: lb.LookbackPlan = ctx.plan
    B, L, width = x.shape
    M = width // 2
    dev = x.device
    # materialisation off: a gradient of an output the loss does not use is None
    d_y = torch.zeros_like(x) if d_y is None else d_y.contiguous()
    d_last = lb._last_grad(d_last_r, d_last_i)
    grad_x = torch.empty_like(x)
    gh0 = (_grads.pair(B, M, dtype=torch.float32, device=dev)
           if h0_r is not None else (None, None))
    work = lb._backward_work(ctx, plan, B, L, M, dev, fused=True)
    g_ctl, g_spec, g_gamma = lb._grad_buffers(plan, work, B, L, M, dev, fused=True)
    lb._launch(plan, True, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
               seg=seg, x=(d_y, None), h0=(h0_r, h0_i), y=(h_r, h_i), end=d_last,
               gh0=gh0, p_ctl=g_ctl, p_spec=g_spec, ctl=ctl, gamma=gamma, o=grad_x, xw=x,
               p_gamma=g_gamma, sync=work.bwd_sync, kept=not _grads.in_operator(ctx))
    d_eta, d_delta, g_nu, g_theta = lb._reduced(plan, g_ctl, g_spec)
    # the controller's grad x added into the scan's (grad_x is written in place)
    _, total = controller.backward(x, dirs, scales, s, d_eta.contiguous(), d_delta.contiguous(),
                                   grad_x, checked=getattr(ctx, "checked", True), whole=True)
    g_dirs, g_scales = controller.dirs_and_scales(total)
    if _grads.in_operator(ctx):
        ctx.dirs_block = total           # the operator returns it whole (no copies of views)
    return (g_dirs, g_scales, g_nu, g_theta, grad_x,
            g_gamma if plan.atomic else g_gamma.sum(dim=(0, 1)), gh0)


def _cast(gh0, h0_dtypes) -> tuple:
    """The grad h0 pair cast to h0's dtypes (Nones without an initial state)."""
    return tuple(None if g is None else g.to(d) for g, d in zip(gh0, h0_dtypes, strict=True))


def fused_layer(x: torch.Tensor, dirs: torch.Tensor, scales: torch.Tensor, gamma: torch.Tensor,
                nu_log: torch.Tensor, theta_log: torch.Tensor, cfg: lb.LookbackConfig, *,
                seg: Optional[torch.Tensor] = None,
                h0: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The SAMU layer with the controller kernels and the scan's write and ReLU output fused
    (:class:`FusedLayer`), differentiable in x, dirs, scales, gamma, nu_log, theta_log and
    h0.  All inputs contiguous, parameters fp32; ``cfg`` must be loop-inner (the tile path has
    no fused I/O).  Returns (y, final state).  ValueError on a config that is not a loop-inner
    :class:`~samu_tune.ops.scan.strategies.lookback.LookbackConfig` or on inputs of other
    shapes, dtypes or devices (the kernels index them unchecked; dirs, scales and x are
    checked by the controller's binding)."""
    _check(x, cfg, (("gamma", gamma), ("nu_log", nu_log), ("theta_log", theta_log)), seg, h0)
    h0_r, h0_i = h0 if h0 is not None else (None, None)
    y, last_r, last_i = _grads.apply(FusedLayer, lb.LookbackPlan.of(cfg), seg, dirs, scales,
                                     nu_log, theta_log, x, gamma, h0_r, h0_i)
    return y, (last_r, last_i)


def fused_layer_params(x: torch.Tensor, pd: torch.Tensor, rd: torch.Tensor, pa: torch.Tensor,
                       ra: torch.Tensor, nu_log: torch.Tensor, theta_log: torch.Tensor,
                       cfg: lb.LookbackConfig, *, seg: Optional[torch.Tensor] = None,
                       h0: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fused_layer` from the raw parameters (:class:`FusedLayerParams`): directions
    pd, rd [2M + 1], amplitudes pa, ra (0-d), nu_log, theta_log [M], all fp32 contiguous on
    x's device; differentiable in x, the parameters and h0."""
    _check(x, cfg, (("nu_log", nu_log), ("theta_log", theta_log)), seg, h0)
    width = x.shape[-1]
    # what the controller's binding checks on fused_layer's path
    if x.dtype not in controller.X_DTYPES or not x.is_contiguous():
        raise ValueError(f"fused SAMU layer: x must be contiguous bf16 / fp16 / fp32, got "
                         f"{x.dtype}{'' if x.is_contiguous() else ' (strided)'}")
    if seg is not None and (not seg.is_contiguous() or seg.device != x.device):
        raise ValueError(f"fused SAMU layer: seg must be contiguous on {x.device}")
    for what, t, shape in (("phase direction", pd, (width + 1,)),
                           ("radial direction", rd, (width + 1,)),
                           ("phase amplitude", pa, ()), ("radial amplitude", ra, ())):
        controller.check_tensor("fused SAMU layer", what, t, shape, torch.float32, x.device)
    h0_r, h0_i = h0 if h0 is not None else (None, None)
    y, last_r, last_i = _grads.apply(FusedLayerParams, lb.LookbackPlan.of(cfg), seg, pd, rd,
                                     pa, ra, nu_log, theta_log, x, h0_r, h0_i)
    return y, (last_r, last_i)


def _check(x: torch.Tensor, cfg, per_mode, seg: Optional[torch.Tensor], h0) -> None:
    """ValueError unless ``cfg`` is a loop-inner look-back config, x is [B, L, 2M], each of
    ``per_mode`` ((name, tensor) pairs) fp32 [M] and seg, h0 fit x."""
    if not isinstance(cfg, lb.LookbackConfig) or cfg.inner != "loop":
        raise ValueError(f"the fused SAMU layer needs a loop-inner LookbackConfig, got {cfg!r}")
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"fused SAMU layer: x must be [B, L, 2M], got {list(x.shape)}")
    B, L, width = x.shape
    dev, f32 = x.device, torch.float32
    for what, t in per_mode:
        controller.check_tensor("fused SAMU layer", what, t, (width // 2,), f32, dev)
    for what, t in zip(("h0[0]", "h0[1]"), h0 or ()):
        controller.check_tensor("fused SAMU layer", what, t, (B, width // 2), f32, dev)
    if seg is not None and (tuple(seg.shape) != (B, L) or seg.is_floating_point()):
        raise ValueError(f"fused SAMU layer: seg must be integers [B, L] = {[B, L]}, got "
                         f"{list(seg.shape)} {seg.dtype}")
