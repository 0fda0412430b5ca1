"""The scan, the fused SAMU layer, the decode step and the linear scans as torch.library
operators.

Namespace ``samu_tune``: ``scan_fwd`` / ``scan_bwd``, ``layer_fwd`` / ``layer_bwd``,
``decode_step`` (functional) and ``decode_step_`` (writes its outputs in place), and the
generic real / complex scans ``linear_fwd`` / ``linear_bwd``.  Each has a
fake (meta) implementation that gives the outputs' shapes, dtypes and strides from the inputs
alone (no dispatch decision: symbolic shapes trace), and the forward operators' autograd is
registered to their backward operators, so ``torch.compile(..., fullgraph=True)`` traces a
model calling :func:`samu_tune.scan`, :class:`samu_tune.SAMU` or ``SAMU.step`` without a graph
break and ``mode="reduce-overhead"`` captures the kernels in CUDA graphs.

The dispatch decision is made inside the operators (memoized per call signature, as in eager
calls; never tuned while a CUDA graph is captured), so a compiled graph follows the cache like
eager code does.  The backward operator decides again with the forward's call signature and
hits the same memo entry.  What backward needs beyond inputs and outputs is returned by the
forward operator as a tensor (``aux``: the look-back loop walk's control table [B L, 4] fp32,
written by the forward kernel); other per-launch state is recomputed or re-zeroed by the
backward operator.  An operator's outputs may not alias each other or its inputs: outputs
that share storage (views of one workspace, e.g. two gradient sums) are copied
(:func:`_owned`: only vectors and [B, L] / [B, M] tensors in practice).

Eager calls do not go through these operators: the strategies' autograd Functions are called
directly, which costs less host time per call than the dispatcher's boxed Python kernels.
"""
from __future__ import annotations

import json
from typing import Optional

import torch
from torch import Tensor

from . import dispatch
from .strategies import _grads
from .tensors import ScanInputs, ScanOutput

_F32 = torch.float32
_assume_constant = getattr(torch.compiler, "assume_constant_result", lambda f: f)
TABLE_COLS = 4          # the control table's columns (samu_tune.kernels.controls)


@_assume_constant
def strategy_string(strategy) -> str:
    """A strategy argument (``"auto"``, a name, or ``(name, config)``) as an operator's str
    argument: the name itself, or JSON ``[name, config dict]``."""
    if isinstance(strategy, str):
        return strategy
    if isinstance(strategy, (tuple, list)) and len(strategy) == 2:
        name, cfg = strategy
        if hasattr(cfg, "model_dump"):
            cfg = cfg.model_dump(mode="json")
        return json.dumps([name, cfg])
    raise TypeError(f"strategy must be 'auto', a strategy name or (name, config), "
                    f"got {strategy!r}")


def _strategy_arg(text: str):
    if text.startswith("["):
        name, cfg = json.loads(text)
        return (name, cfg)
    return text


def _owned(outputs: tuple, inputs: tuple = ()) -> tuple:
    """``outputs`` with every tensor that is an offset or strided view (the fake
    implementations give fresh contiguous tensors; two views of one allocation are offset
    from each other) or starts where an input or an earlier output starts, replaced by a
    contiguous copy: an operator's outputs may not alias each other or its inputs."""
    seen = {t.data_ptr() for t in inputs if isinstance(t, Tensor) and t.numel()}
    out = []
    for t in outputs:
        if isinstance(t, Tensor) and t.numel():
            if t.storage_offset() or not t.is_contiguous() or t.data_ptr() in seen:
                t = t.clone(memory_format=torch.contiguous_format)
            seen.add(t.data_ptr())
        out.append(t)
    return tuple(out)


# ---- the scan --------------------------------------------------------------------------------

def _saves_table(function, plan) -> bool:
    """Whether ``function``'s forward saves the control table (its last saved tensor)."""
    return getattr(function, "saves_table", lambda p: False)(plan)


def _scan_decision(inputs: ScanInputs, needs_grad: bool, strategy: str):
    d = dispatch._decide(inputs, _strategy_arg(strategy), backward=needs_grad)
    return d.strategy, d.config


@torch.library.custom_op("samu_tune::scan_fwd", mutates_args=())
def scan_fwd(eta: Tensor, delta: Tensor, nu_log: Tensor, theta_log: Tensor, br: Tensor,
             bi: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
             segment_pos: Optional[Tensor], output_final_state: bool, needs_grad: bool,
             strategy: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The scan forward: (out_r, out_i [B, L, M] in br's dtype, last_r, last_i fp32 [B, M],
    aux fp32 [B L, 4]: what the chosen strategy's backward reads besides inputs and
    outputs).  Inputs validated and contiguous (:func:`samu_tune.validation.validate`)."""
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
    return _owned((out_r, out_i, last_r.to(_F32), last_i.to(_F32), aux),
                  (eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i, segment_pos))


@scan_fwd.register_fake
def _scan_fwd_fake(eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i, segment_pos,
                   output_final_state, needs_grad, strategy):
    B, L, M = br.shape
    return (torch.empty_like(br), torch.empty_like(bi), br.new_empty((B, M), dtype=_F32),
            br.new_empty((B, M), dtype=_F32), br.new_empty((B * L, TABLE_COLS), dtype=_F32))


@torch.library.custom_op("samu_tune::scan_bwd", mutates_args=())
def scan_bwd(d_out_r: Optional[Tensor], d_out_i: Optional[Tensor], d_last_r: Optional[Tensor],
             d_last_i: Optional[Tensor], eta: Tensor, delta: Tensor, nu_log: Tensor,
             theta_log: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
             segment_pos: Optional[Tensor], out_r: Tensor, out_i: Tensor, aux: Tensor,
             output_final_state: bool, strategy: str) -> list[Tensor]:
    """The scan backward: [grad eta, grad delta, grad nu_log, grad theta_log (their dtypes),
    grad br, grad bi (out's dtypes), grad h0_r, grad h0_i (h0's dtypes; empty [0] without
    h0)].  Runs the strategy the forward ran (same call signature, same memoized decision)."""
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
    grads = function.backward(ctx, d_out_r, d_out_i, d_last_r, d_last_i)[2:]
    grads = [g if g is not None else eta.new_empty(0) for g in grads]
    return list(_owned(tuple(grads), (eta, delta, nu_log, theta_log, h0_r, h0_i,
                                      segment_pos, out_r, out_i, aux)))


@scan_bwd.register_fake
def _scan_bwd_fake(d_out_r, d_out_i, d_last_r, d_last_i, eta, delta, nu_log, theta_log,
                   h0_r, h0_i, segment_pos, out_r, out_i, aux, output_final_state, strategy):
    h0 = ([torch.empty_like(h0_r), torch.empty_like(h0_i)] if h0_r is not None
          else [eta.new_empty(0), eta.new_empty(0)])
    return [torch.empty_like(eta), torch.empty_like(delta), torch.empty_like(nu_log),
            torch.empty_like(theta_log), torch.empty_like(out_r), torch.empty_like(out_i), *h0]


def _scan_setup(ctx, inputs, output):
    (eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i, seg, final, needs_grad,
     strategy) = inputs
    out_r, out_i, _, _, aux = output
    ctx.save_for_backward(eta, delta, nu_log, theta_log, h0_r, h0_i, seg, out_r, out_i, aux)
    ctx.args = (final, strategy)


def _scan_backward(ctx, d_out_r, d_out_i, d_last_r, d_last_i, _d_aux):
    eta, delta, nu_log, theta_log, h0_r, h0_i, seg, out_r, out_i, aux = ctx.saved_tensors
    g = torch.ops.samu_tune.scan_bwd(d_out_r, d_out_i, d_last_r, d_last_i, eta, delta, nu_log,
                                     theta_log, h0_r, h0_i, seg, out_r, out_i, aux, *ctx.args)
    gh0 = (g[6], g[7]) if h0_r is not None else (None, None)
    return (*g[:6], *gh0, None, None, None, None)


scan_fwd.register_autograd(_scan_backward, setup_context=_scan_setup)


@_assume_constant
def operators_serve(strategy: str) -> bool:
    """Whether the scan operators can run what ``strategy`` may choose: every scan strategy
    that dispatch may pick (for ``"auto"``: all registered but ``reference``, which runs
    only float64 and plain-CPU problems, traced apart) has an autograd Function to split
    into forward and backward operators.  Decided while torch.compile traces."""
    from . import registry
    arg = _strategy_arg(strategy)
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
    out_r, out_i, last_r, last_i, _ = torch.ops.samu_tune.scan_fwd(
        inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log, inputs.br, inputs.bi,
        h0_r, h0_i, inputs.segment_pos, inputs.output_final_state, needs_grad,
        strategy_string(strategy))
    return ScanOutput(out_r, out_i, (last_r, last_i) if inputs.output_final_state else None)


# ---- the fused SAMU layer --------------------------------------------------------------------

def _layer_config(x: Tensor, seg: Optional[Tensor], has_state: bool, scan_strategy: str,
                  needs_grad: bool):
    """The fused layer's loop-inner config for this call: the eager path's choice, else (a
    sequence too short for the loop configs' pruning, met by a graph traced with symbolic
    sizes) the choice for 64 tokens of the same B and M: a loop walk is correct for any L
    (a chunk longer than L is one partial chunk)."""
    from .layer import fused
    strategy = _strategy_arg(scan_strategy)
    cfg = fused.config_for(x, seg, has_state, strategy, needs_grad)
    if cfg is None:
        B, L, width = x.shape
        cfg = fused.config_for_call((B, max(L, 64), width), x.dtype, x.device, seg is not None,
                                    has_state, strategy, needs_grad)
    if cfg is None:
        raise ValueError(f"the fused SAMU layer cannot run x of shape {list(x.shape)} "
                         "(2M must exceed 128)")
    return cfg


@torch.library.custom_op("samu_tune::layer_fwd", mutates_args=())
def layer_fwd(x: Tensor, dirs: Tensor, scales: Tensor, gamma: Tensor, nu_log: Tensor,
              theta_log: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
              segment_pos: Optional[Tensor], needs_grad: bool, scan_strategy: str
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The fused SAMU layer forward (:class:`samu_tune.strategies.lookback._FusedLayer`):
    (y [B, L, 2M] in x's dtype, last_r, last_i fp32 [B, M], and for backward: the
    controller's buffer fp32 [4, T4] (rows eta, delta, tanh q_p, r; T4 = B L rounded up to
    4), the states h_r, h_i [B, L, M] in x's dtype (empty [0] unless ``needs_grad``), the
    control table fp32 [B L, 4])."""
    from .strategies import lookback
    cfg = _layer_config(x, segment_pos, h0_r is not None, scan_strategy, needs_grad)
    ctx = _grads.OpContext(training=needs_grad)
    y, last_r, last_i = lookback._FusedLayer.forward(
        ctx, lookback.LookbackPlan.of(cfg), segment_pos, dirs, scales, nu_log, theta_log, x,
        gamma, h0_r, h0_i)
    saved = ctx.saved_tensors
    c_eta, h_r, h_i, table = saved[3], saved[12], saved[13], saved[14]
    # eta, delta, s are the rows of one [4, T4] allocation (strategies.controller.forward)
    t4 = _t4(c_eta.numel())
    buf = c_eta.as_strided((4, t4), (t4, 1), c_eta.storage_offset())
    if h_r is None:
        h_r, h_i = x.new_empty(0), x.new_empty(0)
    return _owned((y, last_r, last_i, buf, h_r, h_i, table),
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


@torch.library.custom_op("samu_tune::layer_bwd", mutates_args=())
def layer_bwd(d_y: Optional[Tensor], d_last_r: Optional[Tensor], d_last_i: Optional[Tensor],
              x: Tensor, dirs: Tensor, scales: Tensor, gamma: Tensor, nu_log: Tensor,
              theta_log: Tensor, h0_r: Optional[Tensor], h0_i: Optional[Tensor],
              segment_pos: Optional[Tensor], ctl_buf: Tensor, h_r: Tensor, h_i: Tensor,
              table: Tensor, scan_strategy: str) -> list[Tensor]:
    """The fused SAMU layer backward: [grad dirs, grad scales, grad nu_log, grad theta_log,
    grad x, grad gamma, grad h0_r, grad h0_i (empty [0] without h0)]."""
    from .strategies import lookback
    cfg = _layer_config(x, segment_pos, h0_r is not None, scan_strategy, True)
    T = x.numel() // x.shape[-1]
    c = ctl_buf[:, :T]
    ctx = _grads.OpContext(
        (segment_pos, dirs, scales, c[0], c[1], c[2:], nu_log, theta_log, x, gamma, h0_r, h0_i,
         h_r, h_i, table),
        plan=lookback.LookbackPlan.of(cfg), dtypes=_grads.dtypes(h0_r, h0_i))
    grads = lookback._FusedLayer.backward(ctx, d_y, d_last_r, d_last_i)[2:]
    grads = [g if g is not None else x.new_empty(0, dtype=_F32) for g in grads]
    return list(_owned(tuple(grads), (x, dirs, scales, gamma, nu_log, theta_log, h0_r, h0_i,
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


# ---- the decode step -------------------------------------------------------------------------

def _decode_plan(x: Tensor, M: int, has_state: bool, strategy: str):
    from .layer import decode
    return decode.plan_for(_strategy_arg(strategy), x, M, has_state)


def _decode_run(x, consts, state_r, state_i, out, so_r, so_i, M, strategy):
    from .layer import decode
    has_state = state_r is not None
    plan = _decode_plan(x, M, has_state, strategy)
    if plan.name == "reference":
        raise ValueError("the decode operators run the single / blocked kernels; the "
                         "reference runs as traced torch code")
    state = (state_r, state_i) if has_state else None
    return decode._launch(plan, x, consts, state, out, (so_r, so_i) if so_r is not None
                          else None)


@torch.library.custom_op("samu_tune::decode_step", mutates_args=())
def decode_step(x: Tensor, consts: Tensor, state_r: Optional[Tensor],
                state_i: Optional[Tensor], M: int, strategy: str
                ) -> tuple[Tensor, Tensor, Tensor]:
    """One decode step: (y [B, 2M] in x's dtype, new state h_r, h_i fp32 [B, M]) from x
    [B, 2M], the digested parameters ``consts`` fp32 [8M + 4]
    (:func:`samu_tune.layer.decode.decode_constants`) and the state (None: zeros)."""
    y, (h_r, h_i) = _decode_run(x, consts, state_r, state_i, None, None, None, M, strategy)
    return y, h_r, h_i


@decode_step.register_fake
def _decode_step_fake(x, consts, state_r, state_i, M, strategy):
    B = x.shape[0]
    return (torch.empty_like(x), x.new_empty((B, M), dtype=_F32),
            x.new_empty((B, M), dtype=_F32))


@torch.library.custom_op("samu_tune::decode_step_",
                         mutates_args=("state_r", "state_i", "out"))
def decode_step_(x: Tensor, consts: Tensor, state_r: Tensor, state_i: Tensor, out: Tensor,
                 has_state: bool, M: int, strategy: str) -> None:
    """One decode step in place: reads the state from (state_r, state_i) when ``has_state``
    (else zeros) and writes the new state there and y into ``out``."""
    _decode_run(x, consts, state_r if has_state else None, state_i if has_state else None,
                out, state_r, state_i, M, strategy)


@decode_step_.register_fake
def _decode_step__fake(x, consts, state_r, state_i, out, has_state, M, strategy):
    return None


# ---- the generic linear scans ----------------------------------------------------------------

def _linear_choice(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse: bool, needs_grad: bool,
                   strategy: str):
    from .ops import linear_scan as ls
    h0 = None if h0_r is None else ls.Pair(h0_r, h0_i)
    name, cfg = ls.choice(ls.Pair(a_r, a_i), ls.Pair(b_r, b_i), h0, reverse,
                          _strategy_arg(strategy), needs_grad)
    if name == "reference":
        raise NotImplementedError("the linear-scan operators run the serial / chunk kernels; "
                                  "the reference runs as traced torch code")
    return cfg


@torch.library.custom_op("samu_tune::linear_fwd", mutates_args=())
def linear_fwd(a_r: Tensor, a_i: Optional[Tensor], b_r: Tensor, b_i: Optional[Tensor],
               h0_r: Optional[Tensor], h0_i: Optional[Tensor], reverse: bool,
               needs_grad: bool, strategy: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``h[t] = a[t] h[t-1] + b[t]`` (complex when a_i is given) over [B, L, D]: (out_r,
    out_i [B, L, D] in b's dtype, last_r, last_i fp32 [B, D]; the imaginary parts empty [0]
    for a real scan)."""
    from .ops import launch
    cfg = _linear_choice(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad, strategy)
    h0 = None if h0_r is None else launch.Pair(h0_r, h0_i)
    out, last, _ = launch.run(cfg, reverse=reverse, adjoint=False, a=launch.Pair(a_r, a_i),
                              x=launch.Pair(b_r, b_i), h0=h0, out_dtype=b_r.dtype)
    outs = (out.r, out.i if out.i is not None else b_r.new_empty(0), last.r,
            last.i if last.i is not None else b_r.new_empty(0, dtype=_F32))
    return _owned(outs, (a_r, a_i, b_r, b_i, h0_r, h0_i))


@linear_fwd.register_fake
def _linear_fwd_fake(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad, strategy):
    B, L, D = a_r.shape
    complex_ = a_i is not None
    return (torch.empty_like(b_r), torch.empty_like(b_r) if complex_ else b_r.new_empty(0),
            b_r.new_empty((B, D), dtype=_F32),
            b_r.new_empty((B, D), dtype=_F32) if complex_ else b_r.new_empty(0, dtype=_F32))


@torch.library.custom_op("samu_tune::linear_bwd", mutates_args=())
def linear_bwd(g_out_r: Optional[Tensor], g_out_i: Optional[Tensor],
               g_last_r: Optional[Tensor], g_last_i: Optional[Tensor], a_r: Tensor,
               a_i: Optional[Tensor], out_r: Tensor, out_i: Optional[Tensor],
               h0_r: Optional[Tensor], h0_i: Optional[Tensor], reverse: bool,
               strategy: str) -> list[Tensor]:
    """The linear scan's backward (the adjoint scan in the other direction): [grad a_r,
    grad a_i, grad b_r, grad b_i, grad h0_r, grad h0_i] (absent parts empty [0])."""
    from .ops import launch
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
    return list(_owned(outs, (a_r, a_i, out_r, out_i, h0_r, h0_i)))


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
    g = torch.ops.samu_tune.linear_bwd(g_out_r, g_out_i, g_last_r, g_last_i, a_r, a_i, out_r,
                                       out_i, h0_r, h0_i, *ctx.args)
    complex_ = a_i is not None
    has_h0 = h0_r is not None
    return (g[0], g[1] if complex_ else None, g[2], g[3] if complex_ else None,
            g[4] if has_h0 else None, g[5] if has_h0 and complex_ else None, None, None, None)


linear_fwd.register_autograd(_linear_backward, setup_context=_linear_setup)


def linear_scan(a_r, a_i, b_r, b_i, h0_r, h0_i, *, reverse: bool, strategy="auto"):
    """The linear scan through the operators (traceable): (out_r, out_i, last_r, last_i)."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (a_r, a_i, b_r, b_i, h0_r, h0_i))
    return torch.ops.samu_tune.linear_fwd(a_r, a_i, b_r, b_i, h0_r, h0_i, reverse, needs_grad,
                                          strategy_string(strategy))
