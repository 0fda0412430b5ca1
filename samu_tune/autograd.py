"""Autograd plumbing shared by the Triton strategies (``serial``, ``lookback``, chunk family).

Each strategy's ``torch.autograd.Function`` takes ``(plan, seg, eta, delta, nu_log,
theta_log, br, bi, h0_r, h0_i)`` and returns ``(out_r, out_i, last_r, last_i)``; its backward
runs the reverse scan into the buffers of :func:`backward_buffers` (``lookback``: of
:func:`grad_outputs`, its incoming gradients may be None) and returns :func:`input_grads`.
:func:`scan_function` builds such a Function from a strategy's launches (``serial``, the chunk
family); ``lookback`` writes its own (a control table, zeroed look-back statuses, gradients
of unused outputs left None).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional

import torch

from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune import alloc as _alloc
from samu_tune.library import is_compiling as _is_compiling

Pair = tuple[Optional[torch.Tensor], Optional[torch.Tensor]]


class _NoGradContext:
    """Stands in for autograd's ctx when no gradient is needed: the forward's saves are
    dropped.  Calling ``forward`` directly skips ``Function.apply``'s bookkeeping, about a
    tenth of a forward call's host time on an H200 host.  ``in_operator``: the ctx of a
    torch.library operator (:class:`OpContext`); ``training``: keep what backward reads (the
    fused layer's states) although no autograd ctx is there (an operator's forward)."""

    in_operator = False
    training = False
    # the forward may write what the caller drops (an unrequested final state) and what only
    # a backward reads into kept scratch buffers (:mod:`samu_tune.scratch`)
    scratch = False

    def save_for_backward(self, *tensors) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


class OpContext(_NoGradContext):
    """The ctx of a Function's forward or backward run inside a torch.library operator
    (:mod:`samu_tune.library`): forward keeps what it saves in ``saved_tensors`` (the
    operator returns what backward needs as outputs); backward reads ``saved_tensors`` and
    the attributes the operator sets."""

    in_operator = True

    def __init__(self, saved: tuple = (), **attrs) -> None:
        self.saved_tensors = saved
        self.__dict__.update(attrs)

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors


def training(ctx) -> bool:
    """Whether a Function's forward runs for a backward to come (autograd's ctx, or an
    operator's :class:`OpContext` with ``training``)."""
    return not isinstance(ctx, _NoGradContext) or ctx.training


def in_operator(ctx) -> bool:
    """Whether a Function's forward or backward runs inside a torch.library operator (its ctx
    an :class:`OpContext`; autograd's own ctx has no such attribute)."""
    return getattr(ctx, "in_operator", False)


def pair(*shape: int, dtype: torch.dtype, device: torch.device) -> Pair:
    """Two uninitialised tensors of ``shape``, each its own allocation: two ``empty`` cost
    less host time than one ``[2, ...]`` allocation cut into two views (2.2 vs 6.0 us on the
    development CPU), and an output that is no view can be modified in place like any
    tensor.  (:class:`Stacked` is for pairs that one kernel reduces.)"""
    return (_alloc.empty(*shape, dtype=dtype, device=device),
            _alloc.empty(*shape, dtype=dtype, device=device))


def output_pair(br: torch.Tensor, bi: torch.Tensor) -> Pair:
    """The scan's (out_r, out_i) [B, L, M] in br's and bi's dtypes, uninitialised."""
    return _alloc.empty_like(br), _alloc.empty_like(bi)


# autograd's C entry point, which ``Function.apply`` calls after its Python checks; None where
# a torch lays ``_FunctionBase`` out otherwise (then ``Function.apply`` always)
_C_APPLY = getattr(torch._C, "_FunctionBase", object).__dict__.get("apply")
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)


@functools.lru_cache(maxsize=None)
def _c_apply(function: type[torch.autograd.Function]) -> Callable:
    """``function``'s autograd node built by the C entry point directly: what
    ``Function.apply`` runs for a Function without ``setup_context`` while no functorch
    transform is active, less its per-argument unwrapping of tensors leaked out of a finished
    transform (~2.6 us of ~11 us on the development CPU; such a leaked tensor passed in makes
    the backward raise instead).  ``Function.apply`` where that entry point is missing or
    the Function defines ``setup_context``."""
    if (_C_APPLY is None or _transforms_active is None
            or function.setup_context is not torch.autograd.Function.setup_context):
        return function.apply
    return _C_APPLY.__get__(None, function)


class _DropsFinalState(_NoGradContext):
    """The ctx of a no-grad scan call that does not return the final state."""

    scratch = True


def apply(function: type[torch.autograd.Function], *args, no_grad_ctx=_NoGradContext):
    """``function.apply(*args)`` when a tensor argument needs a gradient, else its forward
    called directly with a :class:`_NoGradContext` (no autograd bookkeeping).  Outside
    functorch transforms and torch.compile tracing the node is built through autograd's C
    entry point (:func:`_c_apply`); under a transform (``torch.func``: ``Function.apply``
    raises its own error for these Functions) or while tracing (the compiler knows
    ``Function.apply``), through ``Function.apply``."""
    if torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in args):
        if _transforms_active is None or _transforms_active() or _is_compiling():
            return function.apply(*args)
        return _c_apply(function)(*args)
    return function.forward(no_grad_ctx(), *args)


def apply_scan(function: type[torch.autograd.Function], inputs: ScanInputs, plan) -> ScanOutput:
    """Run ``function`` with ``plan`` on validated ``inputs`` (differentiable)."""
    h0_r, h0_i = inputs.initial_state or (None, None)
    out_r, out_i, last_r, last_i = apply(
        function, plan, inputs.segment_pos, inputs.eta, inputs.delta, inputs.nu_log,
        inputs.theta_log, inputs.br, inputs.bi, h0_r, h0_i,
        no_grad_ctx=_NoGradContext if inputs.output_final_state else _DropsFinalState)
    return ScanOutput(out_r, out_i, (last_r, last_i) if inputs.output_final_state else None)


def dtypes(*tensors: Optional[torch.Tensor]) -> tuple[Optional[torch.dtype], ...]:
    """Each tensor's dtype (None for None), saved in forward to cast the gradients back."""
    return tuple(None if t is None else t.dtype for t in tensors)


def backward_buffers(d_out_r, d_out_i, d_last_r, d_last_i, shape: tuple[int, int, int],
                     b_dtypes: tuple[torch.dtype, torch.dtype], has_h0: bool,
                     device: torch.device) -> tuple[Pair, Pair, Pair, Pair]:
    """Incoming gradients as the kernels read them and the outputs they write.

    Returns ``d_out`` (contiguous, [B, L, M]), ``d_last`` (fp32 contiguous, [B, M]),
    ``grad_b`` (grad br / bi, [B, L, M] in br's / bi's dtype) and ``gh0`` (fp32 [B, M] when
    there is an initial state, else None)."""
    d_out = (d_out_r.contiguous(), d_out_i.contiguous())
    d_last = (d_last_r.to(torch.float32).contiguous(), d_last_i.to(torch.float32).contiguous())
    return (d_out, d_last, *grad_outputs(shape, b_dtypes, has_h0, device))


def grad_outputs(shape: tuple[int, int, int], b_dtypes: tuple[torch.dtype, torch.dtype],
                 has_h0: bool, device: torch.device) -> tuple[Pair, Pair]:
    """The backward's outputs (uninitialised): ``grad_b`` (grad br / bi, [B, L, M] in br's /
    bi's dtype) and ``gh0`` (fp32 [B, M] when there is an initial state, else None)."""
    B, L, M = shape
    grad_b = (_alloc.empty(B, L, M, dtype=b_dtypes[0], device=device),
              _alloc.empty(B, L, M, dtype=b_dtypes[1], device=device))
    gh0 = pair(B, M, dtype=torch.float32, device=device) if has_h0 else (None, None)
    return grad_b, gh0


@functools.lru_cache(maxsize=1024)
def _stacked_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Strides of a [2, *shape] pair whose halves are contiguous and 16-byte aligned."""
    per = 16 // itemsize
    stride = -(-math.prod(shape) // per) * per
    inner = []
    step = 1
    for size in reversed(shape):
        inner.append(step)
        step *= size
    return (stride, *reversed(inner))


class Stacked(tuple):
    """A pair ``(whole[0], whole[1])`` of views of one ``[2, ...]`` tensor ``whole``: one
    allocation, and reduced by one kernel instead of two."""

    def __new__(cls, whole: torch.Tensor) -> "Stacked":
        # two as_strided views: a fraction of unbind's host time (one view op each, no
        # multi-output view bookkeeping)
        shape, strides = whole.shape[1:], whole.stride()[1:]
        at = whole.storage_offset()
        pair = super().__new__(cls, (whole.as_strided(shape, strides, at),
                                     whole.as_strided(shape, strides, at + whole.stride(0))))
        pair.whole = whole
        return pair

    @classmethod
    def empty(cls, *shape: int, dtype: torch.dtype, device: torch.device) -> "Stacked":
        """Uninitialised ``[2, *shape]``; the second half starts 16-byte aligned whatever the
        shape (Triton specialises pointer arguments on 16-byte alignment: an unaligned one
        would compile another binary for some shapes).  One ``empty_strided`` (a view chain
        through ``unflatten`` cost several times the allocation's host time)."""
        return cls(_alloc.empty_strided((2, *shape), _stacked_strides(shape, dtype.itemsize),
                                        dtype=dtype, device=device))


def partials(B: int, L: int, n_tiles: int, spec_shape: tuple[int, ...],
             device: torch.device) -> tuple[Stacked, Stacked]:
    """Per-program partial gradients, fp32: controls (eta, delta) 2 x [B, L, n_tiles] (one
    column per mode tile), spectrum (nu_log, theta_log) 2 x ``spec_shape`` (``[..., M]``)."""
    p_ctl = Stacked.empty(B, L, n_tiles, dtype=torch.float32, device=device)
    p_spec = Stacked.empty(*spec_shape, dtype=torch.float32, device=device)
    return p_ctl, p_spec


def sum_partials(p_ctl: Stacked, p_spec: Stacked) -> tuple[torch.Tensor, ...]:
    """Fixed-order torch reductions (deterministic): control partials [B, L, n_tiles] over
    mode tiles -> [B, L]; spectrum partials [..., M] over every leading dim -> [M].
    Returns (grad eta, grad delta, grad nu_log, grad theta_log), fp32."""
    ctl = p_ctl.whole
    ctl = ctl[..., 0] if ctl.shape[-1] == 1 else ctl.sum(-1)                     # [2, B, L]
    spec = p_spec.whole
    spec = spec.sum(tuple(range(1, spec.dim() - 1))) if spec.dim() > 2 else spec  # [2, M]
    return ctl[0], ctl[1], spec[0], spec[1]


def input_grads(grads: tuple[torch.Tensor, ...], like: tuple[torch.Tensor, ...], grad_b: Pair,
                gh0: Pair, h0_dtypes: tuple) -> tuple:
    """The Function's backward result: no gradient for plan and seg; ``grads`` (of eta, delta,
    nu_log, theta_log) cast to the dtypes of ``like`` (the saved eta, delta, nu_log,
    theta_log); grad br, bi; grad h0 cast to ``h0_dtypes`` when there is an initial state."""
    # a cast only where the dtype differs: a no-op ``to`` still costs a dispatcher call
    casts = tuple(g if g.dtype == t.dtype else g.to(t.dtype)
                  for g, t in zip(grads, like, strict=True))
    gh0_cast = tuple(g if g is None or g.dtype == d else g.to(d)
                     for g, d in zip(gh0, h0_dtypes, strict=True))
    return (None, None, *casts, *grad_b, *gh0_cast)


def scan_function(name: str, doc: str, *, forward_launch: Callable[..., Optional[torch.Tensor]],
                  backward_launch: Callable[..., None],
                  grad_buffers: Callable[..., tuple[Any, Any]],
                  reduce: Callable[..., tuple[torch.Tensor, ...]]
                  ) -> type[torch.autograd.Function]:
    """A scan strategy's autograd Function from its launches, one skeleton for all:

    - forward: outputs allocated (out [B, L, M] pair in br's / bi's dtypes, last fp32 [B, M]
      pair) -> ``forward_launch(plan, seg, eta, delta, nu_log, theta_log, br, bi, h0, out,
      last)``, which returns ``aux`` (one tensor the backward reads besides inputs and outputs,
      or None) -> saved;
    - backward: :func:`backward_buffers` -> ``grad_buffers(plan, B, L, M, device)`` (where the
      reverse launch writes the controls' and spectrum's gradients: partials, or zeroed sums)
      -> ``backward_launch(plan, seg, eta, delta, nu_log, theta_log, h0, out, aux, d_out,
      d_last, grad_b, gh0, g_ctl, g_spec)`` -> ``reduce(plan, g_ctl, g_spec)`` (fp32 grad eta,
      delta, nu_log, theta_log) -> :func:`input_grads`.

    The saved state is what the scan's operators rebuild for a backward of their own
    (:mod:`samu_tune.ops.scan.library`): tensors (seg, eta, delta, nu_log, theta_log, h0_r,
    h0_i, out_r, out_i, aux), ``ctx.plan``, ``ctx.shape`` = (B, L, M) and ``ctx.dtypes`` (of
    br, bi, h0_r, h0_i); an operator passes ``aux`` None, so ``backward_launch`` recomputes it
    when it needs it.
    """

    def forward(ctx, plan, seg, eta, delta, nu_log, theta_log, br, bi, h0_r, h0_i):
        B, L, M = br.shape
        out_r, out_i = output_pair(br, bi)
        last_r, last_i = pair(B, M, dtype=torch.float32, device=br.device)
        aux = forward_launch(plan, seg, eta, delta, nu_log, theta_log, br, bi, (h0_r, h0_i),
                             (out_r, out_i), (last_r, last_i))
        ctx.plan = plan
        ctx.shape = (B, L, M)
        ctx.dtypes = dtypes(br, bi, h0_r, h0_i)
        ctx.save_for_backward(seg, eta, delta, nu_log, theta_log, h0_r, h0_i, out_r, out_i, aux)
        return out_r, out_i, last_r, last_i

    def backward(ctx, d_out_r, d_out_i, d_last_r, d_last_i):
        seg, eta, delta, nu_log, theta_log, h0_r, h0_i, out_r, out_i, aux = ctx.saved_tensors
        plan = ctx.plan
        B, L, M = ctx.shape
        dev = out_r.device
        br_dtype, bi_dtype, h0r_dtype, h0i_dtype = ctx.dtypes
        d_out, d_last, grad_b, gh0 = backward_buffers(
            d_out_r, d_out_i, d_last_r, d_last_i, (B, L, M), (br_dtype, bi_dtype),
            h0_r is not None, dev)
        g_ctl, g_spec = grad_buffers(plan, B, L, M, dev)
        backward_launch(plan, seg, eta, delta, nu_log, theta_log, (h0_r, h0_i), (out_r, out_i),
                        aux, d_out, d_last, grad_b, gh0, g_ctl, g_spec)
        return input_grads(reduce(plan, g_ctl, g_spec), (eta, delta, nu_log, theta_log),
                           grad_b, gh0, (h0r_dtype, h0i_dtype))

    return type(name, (torch.autograd.Function,), {
        "__doc__": doc, "__module__": forward_launch.__module__,
        "forward": staticmethod(forward), "backward": staticmethod(backward)})
