"""The scan as the operators ``samu_tune::scan_fwd`` / ``scan_bwd`` (see :mod:`samu_tune.library`):
the forward returns, besides the outputs, what the chosen strategy's backward reads (``aux``:
the look-back loop walk's control table [B L, 4] fp32)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from samu_tune.library import (F32 as _F32, assume_constant, operator, owned, strategy_arg,
                               strategy_string)

from samu_tune import autograd as _grads
from samu_tune.kernels import controls
from samu_tune.ops.scan import api
from samu_tune.ops.scan.grad_block import OperatorWork, grad_block_layout, packed, unpacked
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput

TABLE_COLS = controls.TABLE_COLS.value     # the control table's columns


def _saves_table(function, plan) -> bool:
    """Whether ``function``'s forward saves the control table (its last saved tensor)."""
    return getattr(function, "saves_table", lambda p: False)(plan)


def _scan_decision(inputs: ScanInputs, needs_grad: bool, strategy: str):
    d = api.decide(inputs, strategy_arg(strategy), backward=needs_grad)
    return d.strategy, d.config


@operator("scan_fwd")
def scan_fwd(eta: Tensor, delta: Tensor, nu_log: Tensor, theta_log: Tensor, br: Tensor,
             bi: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
             segment_pos: Optional[Tensor], output_final_state: bool, needs_grad: bool,
             strategy: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The scan forward: (out_r, out_i [B, L, M] in br's dtype, last_r, last_i fp32 [B, M],
    aux fp32 [B L, 4]: what the chosen strategy's backward reads besides inputs and
    outputs).  Inputs validated and contiguous (:func:`samu_tune.ops.scan.validation.validate`)."""
    B, L, M = br.shape
    h0 = (h0_r, h0_i) if h0_r is not None else None
    inputs = ScanInputs(eta, delta, nu_log, theta_log, br, bi, h0, segment_pos, True)
    strat, cfg = _scan_decision(inputs.replace(output_final_state=output_final_state),
                                needs_grad, strategy)
    aux = None
    if strat.autograd is None:
        out = strat.run(inputs, cfg)
        out_r, out_i, (last_r, last_i) = out.real, out.imag, out.final_state
    else:
        function, plan = strat.autograd(cfg)
        ctx = _grads.OpContext()
        out_r, out_i, last_r, last_i = function.forward(
            ctx, plan, segment_pos, eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i)
        if _saves_table(function, plan):
            aux = ctx.saved_tensors[-1]
    if aux is None:      # unused; zeros keep the operator's outputs deterministic
        aux = torch.zeros(B * L, TABLE_COLS, dtype=_F32, device=br.device)
    return owned((out_r, out_i, last_r.to(_F32), last_i.to(_F32), aux),
                  (eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i, segment_pos))


@scan_fwd.register_fake
def _scan_fwd_fake(eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i, segment_pos,
                   output_final_state, needs_grad, strategy):
    B, L, M = br.shape
    return (torch.empty_like(br), torch.empty_like(bi), br.new_empty((B, M), dtype=_F32),
            br.new_empty((B, M), dtype=_F32), br.new_empty((B * L, TABLE_COLS), dtype=_F32))


@operator("scan_bwd")
def scan_bwd(d_out_r: Optional[Tensor], d_out_i: Optional[Tensor], d_last_r: Optional[Tensor],
             d_last_i: Optional[Tensor], eta: Tensor, delta: Tensor, nu_log: Tensor,
             theta_log: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
             segment_pos: Optional[Tensor], out_r: Tensor, out_i: Tensor, aux: Tensor,
             output_final_state: bool, strategy: str) -> list[Tensor]:
    """The scan backward: [the gradient block (grad eta, delta, nu_log, theta_log, fp32, one
    vector: :mod:`samu_tune.ops.scan.grad_block`; the look-back's zeroed accumulators
    themselves, where four outputs apart would each be a copy), grad br, grad bi (out's
    dtypes), grad h0_r, grad h0_i (h0's dtypes; empty [0] without h0)].  Runs the strategy
    the forward ran (same call signature, same memoized decision)."""
    h0 = (h0_r, h0_i) if h0_r is not None else None
    inputs = ScanInputs(eta, delta, nu_log, theta_log, out_r, out_i, h0, segment_pos,
                        output_final_state)
    strat, cfg = _scan_decision(inputs, True, strategy)
    if strat.autograd is None:
        raise NotImplementedError(
            f"strategy {strat.name!r} has no backward operator: under torch.compile a scan "
            "that needs gradients runs a Triton strategy (float64 runs the traced reference)")
    function, plan = strat.autograd(cfg)
    B, L, M = out_r.shape
    table = aux if _saves_table(function, plan) else None
    ctx = _grads.OpContext(
        (segment_pos, eta, delta, nu_log, theta_log, h0_r, h0_i, out_r, out_i, table),
        plan=plan, shape=(B, L, M),
        dtypes=(out_r.dtype, out_i.dtype, *_grads.dtypes(h0_r, h0_i)))
    if not getattr(function, "accepts_missing_grads", False):   # zeros for unused outputs
        d_out_r, d_out_i = (torch.zeros_like(out_r) if d_out_r is None else d_out_r,
                            torch.zeros_like(out_i) if d_out_i is None else d_out_i)
        if d_last_r is None or d_last_i is None:
            zero = out_r.new_zeros((B, M), dtype=_F32)
            d_last_r = zero if d_last_r is None else d_last_r
            d_last_i = zero if d_last_i is None else d_last_i
    # the look-back's accumulators zeroed as the gradient block itself (grad_block)
    work = ctx.work = OperatorWork(plan, B, L, M, out_r.device) if OperatorWork.serves(
        plan) else None
    grads = function.backward(ctx, d_out_r, d_out_i, d_last_r, d_last_i)[2:]
    block = work.block if work is not None else packed(grads[:4], B, L, M)
    rest = [g if g is not None else eta.new_empty(0) for g in grads[4:]]
    return list(owned((block, *rest), (eta, delta, nu_log, theta_log, h0_r, h0_i,
                                       segment_pos, out_r, out_i, aux)))


@scan_bwd.register_fake
def _scan_bwd_fake(d_out_r, d_out_i, d_last_r, d_last_i, eta, delta, nu_log, theta_log,
                   h0_r, h0_i, segment_pos, out_r, out_i, aux, output_final_state, strategy):
    B, L, M = out_r.shape
    h0 = ([torch.empty_like(h0_r), torch.empty_like(h0_i)] if h0_r is not None
          else [eta.new_empty(0), eta.new_empty(0)])
    return [eta.new_empty(grad_block_layout(B, L, M)[-1], dtype=_F32),
            torch.empty_like(out_r), torch.empty_like(out_i), *h0]


def _scan_setup(ctx, inputs, output):
    (eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i, seg, final, needs_grad,
     strategy) = inputs
    out_r, out_i, _, _, aux = output
    ctx.save_for_backward(eta, delta, nu_log, theta_log, h0_r, h0_i, seg, out_r, out_i, aux)
    ctx.args = (final, strategy)


def _scan_backward(ctx, d_out_r, d_out_i, d_last_r, d_last_i, _d_aux):
    eta, delta, nu_log, theta_log, h0_r, h0_i, seg, out_r, out_i, aux = ctx.saved_tensors
    g = scan_bwd(d_out_r, d_out_i, d_last_r, d_last_i, eta, delta, nu_log, theta_log, h0_r,
                 h0_i, seg, out_r, out_i, aux, *ctx.args)
    B, L, M = out_r.shape
    gh0 = (g[3], g[4]) if h0_r is not None else (None, None)
    casts = (grad.to(t.dtype) for grad, t in zip(unpacked(g[0], B, L, M),
                                                 (eta, delta, nu_log, theta_log)))
    return (*casts, g[1], g[2], *gh0, None, None, None, None)


scan_fwd.register_autograd(_scan_backward, setup_context=_scan_setup)


@assume_constant
def operators_serve(strategy: str) -> bool:
    """Whether the scan operators can run what ``strategy`` may choose: every scan strategy
    that dispatch may pick (for ``"auto"``: all registered but ``reference``, which runs
    only float64 and plain-CPU problems, traced apart) has an autograd Function to split
    into forward and backward operators.  Decided while torch.compile traces."""
    from samu_tune import registry
    arg = strategy_arg(strategy)
    if arg == "auto":
        names = [s.name for s in registry.all_strategies() if s.name != "reference"]
    else:
        names = [arg if isinstance(arg, str) else arg[0]]
    return all(registry.get(n).autograd is not None for n in names)


def scan(inputs: ScanInputs, strategy="auto") -> ScanOutput:
    """:func:`samu_tune.scan` of validated ``inputs`` through the operators (traceable)."""
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in inputs.differentiable())
    h0_r, h0_i = inputs.initial_state if inputs.initial_state is not None else (None, None)
    out_r, out_i, last_r, last_i, _ = scan_fwd(
        inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log, inputs.br, inputs.bi,
        h0_r, h0_i, inputs.segment_pos, inputs.output_final_state, needs_grad,
        strategy_string(strategy))
    return ScanOutput(out_r, out_i, (last_r, last_i) if inputs.output_final_state else None)


