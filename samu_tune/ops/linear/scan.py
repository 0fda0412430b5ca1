"""``samu_tune.real_scan`` and ``samu_tune.complex_scan``: h[t] = a[t] h[t-1] + b[t], [B, L, D].

Strategies: ``serial`` and ``chunk`` (Triton, :mod:`samu_tune.kernels.linear`), and
``reference`` (torch).  The backward pass is the same kernel run as the adjoint scan in the
other direction (see the kernels' docstring), so every strategy has initial state, final
state, ``reverse`` and gradients for a, b and h0 (and from the final state).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch
from pydantic import BaseModel

from samu_tune.library import is_compiling
from samu_tune import dispatch, intmath
from samu_tune.ops.linear.problem import LinearProblem
from samu_tune.problem import dtype_name
from samu_tune.kernel_device import runs_kernels as kernels_available
from samu_tune.ops.linear.launch import ChunkConfig, Config, Pair, SerialConfig, run
from samu_tune.ops.linear.reference import linear_scan_reference

CONFIGS: dict[str, type] = {"serial": SerialConfig, "chunk": ChunkConfig}
StrategyArg = Union[str, tuple[str, Union[Config, dict, None]]]


class RealScanOutput(NamedTuple):
    """``out`` [B, L, D] in b's dtype; ``final_state`` None or fp32 [B, D]."""

    out: torch.Tensor
    final_state: Optional[torch.Tensor] = None


class ComplexScanOutput(NamedTuple):
    """``real``, ``imag`` [B, L, D] in br's dtype; ``final_state`` None or fp32 (h_r, h_i)."""

    real: torch.Tensor
    imag: torch.Tensor
    final_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None


def default_config(name: str, B: int, L: int, D: int) -> Config:
    if name == "serial":
        block_d = max(16, min(128, intmath.next_power_of_2(D)))
        return SerialConfig(block_d=block_d, num_warps=4 if block_d >= 128 else 2)
    block_d = max(16, min(64, intmath.next_power_of_2(D)))
    return ChunkConfig(chunk=32 if L >= 32 else 16, block_d=block_d)


def _needs_grad(a: Pair, b: Pair, h0: Optional[Pair]) -> bool:
    return torch.is_grad_enabled() and any(
        t.requires_grad for p in (a, b, h0) if p is not None for t in p if t is not None)


def problem_of(a: Pair, b: Pair, h0: Optional[Pair], reverse: bool,
               backward: Optional[bool] = None) -> LinearProblem:
    """The :class:`~samu_tune.ops.linear.problem.LinearProblem` of a call (``backward`` by default:
    grad mode is on and an input requires grad)."""
    B, L, D = a.r.shape
    if backward is None:
        backward = _needs_grad(a, b, h0)
    return LinearProblem(
        B=B, L=L, D=D, dtype=dtype_name(b.r.dtype), a_dtype=dtype_name(a.r.dtype),
        complex=a.is_complex, reverse=bool(reverse), initial_state=h0 is not None,
        backward=backward,
        device="cuda" if a.r.is_cuda else "cpu",
        deterministic=torch.are_deterministic_algorithms_enabled())


def _auto(a: Pair, b: Pair, h0: Optional[Pair], reverse: bool,
          backward: Optional[bool] = None) -> tuple[str, Optional[Config]]:
    """``"auto"``: the linear op's dispatch (:mod:`samu_tune.ops.linear.spec`: a tuned or
    shipped choice, else its rule), memoized per call signature (``backward`` by default:
    grad mode is on and an input requires grad)."""
    if backward is None:
        backward = _needs_grad(a, b, h0)
    call_key = ("linear", a.r.shape, a.r.dtype, b.r.dtype, a.r.device, a.is_complex,
                bool(reverse), h0 is not None, backward,
                torch.are_deterministic_algorithms_enabled())
    decision = dispatch.decide(call_key, lambda: problem_of(a, b, h0, reverse, backward), a.r.device)
    if decision.strategy.name == "reference":
        return "reference", None
    return decision.strategy.name, decision.config


class _LinearScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, reverse, a_r, a_i, b_r, b_i, h0_r, h0_i):
        ctx.set_materialize_grads(False)
        complex_ = a_i is not None
        a, b = Pair(a_r, a_i), Pair(b_r, b_i)
        h0 = None if h0_r is None else Pair(h0_r, h0_i)
        out, last, _ = run(cfg, reverse=reverse, adjoint=False, a=a, x=b, h0=h0,
                           out_dtype=b_r.dtype)
        ctx.save_for_backward(a_r, a_i, out.r, out.i, h0_r, h0_i)
        ctx.cfg, ctx.reverse, ctx.complex = cfg, reverse, complex_
        ctx.b_dtype = b_r.dtype
        if complex_:
            return out.r, out.i, last.r, last.i
        return out.r, last.r

    @staticmethod
    def backward(ctx, *grads):
        a_r, a_i, f_r, f_i, h0_r, h0_i = ctx.saved_tensors
        n = 2 if ctx.complex else 1
        g_out, g_last = grads[:n], grads[n:]
        B, L, D = f_r.shape

        def dense(g, like):  # an unused output's gradient arrives as None
            return torch.zeros_like(like) if g is None else g.contiguous()

        x = Pair(*(dense(g, f_r) for g in g_out))
        h0_in = None
        if any(g is not None for g in g_last):
            zero = f_r.new_zeros(B, D, dtype=torch.float32)
            h0_in = Pair(*(dense(g, zero) for g in g_last))
        f0 = None if h0_r is None else Pair(h0_r, h0_i)
        grad_b, grad_h0, grad_a = run(
            ctx.cfg, reverse=not ctx.reverse, adjoint=True, a=Pair(a_r, a_i),
            x=x, h0=h0_in, out_dtype=ctx.b_dtype, f=Pair(f_r, f_i), f0=f0,
            grad_a_dtype=a_r.dtype)
        gh0_r = gh0_i = None
        if h0_r is not None:
            gh0_r = grad_h0.r.to(h0_r.dtype)
            gh0_i = grad_h0.i.to(h0_i.dtype) if ctx.complex else None
        return None, None, grad_a.r, grad_a.i, grad_b.r, grad_b.i, gh0_r, gh0_i


def _check(names: list[str], tensors: list[torch.Tensor], h0_names: list[str],
           h0: list[Optional[torch.Tensor]]) -> tuple[int, int, int]:
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    first = tensors[0]
    if first.ndim != 3:
        raise ValueError(f"{names[0]} must have shape [B, L, D], got {list(first.shape)}")
    B, L, D = first.shape
    for name, t in zip(names[1:], tensors[1:]):
        if t.shape != first.shape:
            raise ValueError(f"{name} must have shape [B, L, D] = {list(first.shape)}, "
                             f"got {list(t.shape)}")
    for name, h in zip(h0_names, h0):
        if h is not None:
            if not isinstance(h, torch.Tensor) or not h.is_floating_point():
                raise TypeError(f"{name} must be a floating point tensor")
            if tuple(h.shape) != (B, D):
                raise ValueError(f"{name} must have shape [B, D] = {[B, D]}, got {list(h.shape)}")
    devices = {t.device for t in tensors + [h for h in h0 if h is not None]}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return B, L, D


def _resolve(strategy: StrategyArg, tensors, B, L, D) -> tuple[str, Optional[Config]]:
    name, config = (strategy, None) if isinstance(strategy, str) else strategy
    if name == "reference":
        return name, None
    if name not in CONFIGS:
        raise ValueError(f"unknown strategy {name!r}; expected 'auto', 'serial', 'chunk' "
                         "or 'reference'")
    if not kernels_available(tensors[0]):
        raise ValueError(f"strategy {name!r} needs CUDA tensors or TRITON_INTERPRET=1")
    model = CONFIGS[name]
    if config is None:
        return name, default_config(name, B, L, D)
    if isinstance(config, model):
        return name, config
    if isinstance(config, BaseModel):
        config = config.model_dump()
    return name, model(**config)


def choice(a: Pair, b: Pair, h0: Optional[Pair], reverse: bool, strategy: StrategyArg,
           backward: Optional[bool] = None) -> tuple[str, Optional[Config]]:
    """The (strategy name, config) a call runs (``"reference"``, None for the torch loop)."""
    if isinstance(strategy, str) and strategy == "auto":
        return _auto(a, b, h0, reverse, backward)
    tensors = [t for p in (a, b, h0) if p is not None for t in p if t is not None]
    B, L, D = a.r.shape
    return _resolve(strategy, tensors, B, L, D)


def _scan(a: Pair, b: Pair, h0: Optional[Pair], reverse: bool, strategy: StrategyArg,
          B: int, L: int, D: int) -> tuple[Pair, Pair]:
    if not (B and L and D):              # an empty dimension: no kernel to run
        out, last = linear_scan_reference(a, b, h0, reverse=reverse)
        if not any(t is not None and t.dtype == torch.float64 for t in (*a, *b)):
            # the final state fp32 as a kernel's, whatever h0's dtype
            last = Pair(*(None if t is None else t.float() for t in last))
        return out, last
    if is_compiling():
        return _scan_traced(a, b, h0, reverse, strategy)
    name, cfg = choice(a, b, h0, reverse, strategy)
    if name == "reference":
        return linear_scan_reference(a, b, h0, reverse=reverse)
    a = Pair(*(None if t is None else t.contiguous() for t in a))
    b = Pair(*(None if t is None else t.contiguous() for t in b))
    h0_r = h0_i = None
    if h0 is not None:
        h0_r = h0.r.contiguous()
        h0_i = None if h0.i is None else h0.i.contiguous()
    outs = _LinearScan.apply(cfg, bool(reverse), a.r, a.i, b.r, b.i, h0_r, h0_i)
    if a.is_complex:
        return Pair(outs[0], outs[1]), Pair(outs[2], outs[3])
    return Pair(outs[0]), Pair(outs[1])


def _scan_traced(a: Pair, b: Pair, h0: Optional[Pair], reverse: bool, strategy: StrategyArg
                 ) -> tuple[Pair, Pair]:
    """:func:`_scan` under torch.compile: the kernels as the operators ``samu_tune::linear_fwd``
    / ``linear_bwd`` (:mod:`samu_tune.ops.linear.library`), the torch loop where they cannot run."""
    from samu_tune.ops.linear import library
    tensors = [t for p in (a, b, h0) if p is not None for t in p if t is not None]
    if (strategy == "reference" or not kernels_available(a.r)
            or any(t.dtype == torch.float64 for t in tensors)):
        return linear_scan_reference(a, b, h0, reverse=reverse)
    outs = library.linear_scan(
        *(t.contiguous() if t is not None else None
          for t in (a.r, a.i, b.r, b.i, *(h0 if h0 is not None else (None, None)))),
        reverse=bool(reverse), strategy=strategy)
    if a.is_complex:
        return Pair(outs[0], outs[1]), Pair(outs[2], outs[3])
    return Pair(outs[0]), Pair(outs[2])


def real_scan(a: torch.Tensor, b: torch.Tensor, *, initial_state: Optional[torch.Tensor] = None,
              output_final_state: bool = False, reverse: bool = False,
              strategy: StrategyArg = "auto") -> RealScanOutput:
    """``h[t] = a[t] * h[t-1] + b[t]`` elementwise over a, b [B, L, D]; h[-1] = initial_state.

    ``reverse=True`` scans right to left: ``h[t] = a[t] * h[t+1] + b[t]`` with h[L] =
    initial_state, and the final state is h[0].  Returns ``RealScanOutput(out [B, L, D] in
    b's dtype, final_state fp32 [B, D] or None)``; any of B, L, D may be 0 (L = 0: the final
    state is the initial state, or zeros).  Differentiable in a, b, initial_state and
    through the final state.  ``strategy``: ``"auto"``, ``"serial"``, ``"chunk"``,
    ``"reference"``, or ``(name, config)`` (:class:`SerialConfig`, :class:`ChunkConfig`).
    """
    B, L, D = _check(["a", "b"], [a, b], ["initial_state"], [initial_state])
    h0 = None if initial_state is None else Pair(initial_state)
    out, last = _scan(Pair(a), Pair(b), h0, reverse, strategy, B, L, D)
    return RealScanOutput(out.r, last.r if output_final_state else None)


def complex_scan(ar: torch.Tensor, ai: torch.Tensor, br: torch.Tensor, bi: torch.Tensor, *,
                 initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                 output_final_state: bool = False, reverse: bool = False,
                 strategy: StrategyArg = "auto") -> ComplexScanOutput:
    """``h[t] = (ar + i ai)[t] * h[t-1] + (br + i bi)[t]`` over [B, L, D] tensors.

    ``initial_state`` is (h0_r, h0_i), each [B, D].  Returns ``ComplexScanOutput(real, imag
    in br's dtype, final_state fp32 (h_r, h_i) or None)``.  Otherwise as :func:`real_scan`.
    """
    if initial_state is not None and (not isinstance(initial_state, (tuple, list))
                                      or len(initial_state) != 2):
        raise TypeError("initial_state must be a pair (h0_r, h0_i) of [B, D] tensors")
    h0_list = list(initial_state) if initial_state is not None else [None, None]
    B, L, D = _check(["ar", "ai", "br", "bi"], [ar, ai, br, bi],
                     ["initial_state[0]", "initial_state[1]"], h0_list)
    for name, re, im in (("ai", ar, ai), ("bi", br, bi)):
        if im.dtype != re.dtype:
            raise TypeError(f"{name} must have the dtype of its real part {re.dtype}, "
                            f"got {im.dtype}")
    h0 = None if initial_state is None else Pair(*initial_state)
    out, last = _scan(Pair(ar, ai), Pair(br, bi), h0, reverse, strategy, B, L, D)
    return ComplexScanOutput(out.r, out.i, (last.r, last.i) if output_final_state else None)
