"""The SAMU layer's fused path (``SAMU(strategy="fused")``): two kernels from x to y.

The unfused layer writes ``br, bi = x[..., :M] gamma, x[..., M:] gamma`` ([B, L, M] each), scans
them into ``h`` ([B, L, M] pair) and builds ``y = relu(cat(Re h, Im h))``: x read once, four
[B, L, M] intermediates written and read again, and its torch controller materialises an fp32
copy of x.  The fused layer is two kernels (:func:`samu_tune.ops.layer.fused_autograd.fused_layer`):
the controller kernel (:mod:`samu_tune.kernels.controller`) reads x once and writes the
per-token controls and the scan's control table; the look-back scan's loop-inner kernel with
the write and the output fused reads x once and writes y once.  Only the controller's
operands (unit directions, amplitude scales: [2, 2M+1] and [2]) and gamma ([M]) are computed
in torch, so that autograd carries their gradients to the parameters.

Training too: forward then also stores the states h ([B, L, M] pair, as the unfused scan's
output) and backward reads d y, h and x once and writes grad x (the relu mask, the write's
derivative and d gamma inside the kernel), then the controller's backward kernel reads x and
adds the controller's grad x into it in place (and sums the direction and amplitude
gradients).  The controller runs inside the fused layer's autograd Function rather than a
Function of its own for that in-place accumulation (see ``FusedLayer``); ``fused_autograd``
binds the kernels, this module only prepares the operands.

It runs on CUDA tensors (or under ``TRITON_INTERPRET=1``) with x in bf16 / fp16 / fp32, fp32
parameters, no ``cu_seqlens`` and a loop-inner look-back config for the problem; otherwise
:func:`forward` returns None and the layer takes the unfused path (same formula: the write is
rounded to x's dtype in both, so the two agree to the scan's rounding).  The config is
dispatch's choice for the equivalent scan problem when that is a loop-inner look-back config,
else the look-back default when that is one, else the loop config of 32-step chunks with the
fewest lanes per thread (loop configs need M > 64).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from pydantic import BaseModel

from samu_tune.library import is_compiling
from samu_tune import dispatch
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.problem import dtype_name
from samu_tune.settings import settings
from samu_tune.ops.layer import fused_autograd
from samu_tune.ops.scan.strategies import lookback
from samu_tune.ops.layer import operands as operand_kernels
from samu_tune.ops.layer import controller
from samu_tune.ops.layer.reference import SAMUParams, State, needs_grad, write_gamma

FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def scan_problem(x: torch.Tensor, segment_pos: Optional[torch.Tensor], has_state: bool,
                 backward: bool = False) -> ScanProblem:
    """The scan problem inside a layer call on ``x`` [B, L, 2M] (final state always)."""
    B, L, width = x.shape
    return ScanProblem(B=B, L=L, M=width // 2, dtype=dtype_name(x.dtype),
                       device=x.device.type, resets=segment_pos is not None,
                       initial_state=has_state, final_state=True, backward=backward,
                       deterministic=torch.are_deterministic_algorithms_enabled())


def config_for(x: torch.Tensor, segment_pos: Optional[torch.Tensor], has_state: bool,
               scan_strategy="auto", backward: bool = False) -> Optional[BaseModel]:
    """The loop-inner look-back config the fused layer runs for ``x`` [B, L, 2M], or None.

    The scan's dispatch decision is memoized per call signature (``dispatch.decide``, as
    ``samu_tune.scan``'s), so a repeated call costs a few dictionary lookups."""
    return config_for_call(x.shape, x.dtype, x.device, segment_pos is not None, has_state,
                           scan_strategy, backward)


def config_for_call(shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device,
                    resets: bool, has_state: bool, scan_strategy="auto",
                    backward: bool = False) -> Optional[BaseModel]:
    """:func:`config_for` of a call on x of ``shape`` [B, L, 2M], ``dtype``, ``device``."""
    decide, problem = call_decision("samu-fused-scan", ScanProblem, shape, dtype, device,
                                    resets, has_state, backward, scan_strategy,
                                    final_state=True)
    return _loop_choice(decide, problem)


def call_decision(tag: str, problem_type: type, shape: tuple[int, int, int],
                  dtype: torch.dtype, device: torch.device, resets: bool, has_state: bool,
                  backward: bool, strategy="auto", **fields):
    """(``decide()``, ``problem()``) of a layer call on x of ``shape`` [B, L, 2M]: the
    memoized dispatch decision of its ``problem_type`` problem (:func:`samu_tune.dispatch.
    decide`, keyed by ``tag`` and the call's signature) and the problem itself, built only
    when asked for; ``fields``: the problem type's further fields."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    call_key = (tag, tuple(shape), dtype, device, resets, has_state, backward, deterministic)

    def problem():
        B, L, width = shape
        return problem_type(B=B, L=L, M=width // 2, dtype=dtype_name(dtype),
                            device="cuda" if device.type == "cuda" else "cpu",
                            resets=resets, initial_state=has_state, backward=backward,
                            deterministic=deterministic, **fields)
    return (lambda: dispatch.decide(call_key, problem, device, strategy)), problem


def config_for_problem(problem: ScanProblem, scan_strategy="auto",
                       device: Optional[torch.device] = None) -> Optional[BaseModel]:
    """:func:`config_for` of the layer's scan ``problem`` (not memoized: eligibility checks)."""
    return _loop_choice(
        lambda: dispatch.choose(problem, scan_strategy, device=device, allow_tune=False),
        lambda: problem)


def _loop_choice(decide, problem) -> Optional[BaseModel]:
    """The scan's dispatch decision (``decide()``) when it is a loop-inner look-back config,
    else :func:`_loop_config` of ``problem()``; either through :func:`_fused_measured`."""
    cfg = None
    try:
        decision = decide()
        if decision.strategy.name == "lookback" and decision.config.inner == "loop":
            cfg = decision.config
    except Exception:  # dispatch cannot decide (e.g. nothing eligible): the default below
        pass
    cfg = cfg or _loop_config(problem())
    return None if cfg is None else _fused_measured(cfg)


@functools.lru_cache(maxsize=256)
def _fused_measured(cfg: BaseModel) -> BaseModel:
    """``cfg`` within the fused-layer configs timed on a GPU, the one-row unstaged walks: one
    row per walk step when it walks two at more than 2 lanes per thread (two rows raise the
    fused backward's registers by 60%, ptxas sm_90), and the register prefetch instead of
    software-pipeline stages (the staged fused kernels pass the interpreter tests and compile
    for sm_90, ``FUSED=1 python -m tools.lookback_registers``, but are not timed on a GPU).  The
    measurements: docs/performance.md."""
    update = {}
    if cfg.rows > 1 and lookback.lanes_per_thread(cfg) > 2:
        update["rows"] = 1
    if cfg.stages > 1:
        update["stages"] = 1
    return cfg.model_copy(update=update) if update else cfg


@functools.lru_cache(maxsize=512)
def _loop_config(problem: ScanProblem) -> Optional[BaseModel]:
    """The look-back default when it loops, else the loop config nearest the default's shape
    (narrow M: the default is the tile scan there), else None (M <= 64 or L <= 16)."""
    cfg = lookback.default(problem)
    if cfg.inner == "loop" and lookback.valid(problem, cfg):
        return cfg
    loops = [c for c in lookback.STRATEGY.configs(problem) if c.inner == "loop"]
    return min(loops, key=lambda c: (c.chunk != 32, lookback.lanes_per_thread(c), c.block_m),
               default=None)


def operands(params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dirs [2, 2M+1], scales [2], gamma [M]), fp32 contiguous: the unit directions,
    (tanh a_p, tanh a_r) / sqrt(M) and the write normalisation, differentiable in the
    parameters: eagerly by one kernel each way (:mod:`samu_tune.ops.layer.operands`), under
    torch.compile in torch (:func:`operands_torch`, which the compiler fuses)."""
    if is_compiling() or any(p.dtype != torch.float32 for p in params):
        return operands_torch(params)
    return operand_kernels.operands(*(p.contiguous() for p in (
        params.phase_direction, params.radial_direction, params.phase_amplitude,
        params.radial_amplitude, params.nu_log)))


def operands_torch(params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`operands` in torch."""
    dirs, scales = controller.kernel_operands(params)
    return dirs, scales, write_gamma(params.nu_log.to(torch.float32)).contiguous()


def operands_no_grad(params: SAMUParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`operands` without an autograd graph: what a ``ConstantsCache`` of the layer
    keeps between no-grad calls (about a dozen tiny torch launches saved per call)."""
    with torch.no_grad():
        return operands(params)


def forward(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None,
            segment_pos: Optional[torch.Tensor] = None, scan_strategy="auto",
            operands_cache=None) -> Optional[tuple[torch.Tensor, State]]:
    """``(y [B, L, 2M] in x's dtype, final state fp32 [B, M] pair)``, or None when the fused
    path cannot run this call (see the module docstring).  ``operands_cache``: a
    :class:`samu_tune.ops.decode.step.ConstantsCache` of :func:`operands_no_grad`, used when no
    gradient is needed (the same fp32 values as computing them per call)."""
    if not fits(x, params, state, segment_pos):
        return None       # the unfused path's validation names the problem
    grad = needs_grad(x, params, state)
    cfg = config_for(x, segment_pos, state is not None, scan_strategy, grad)
    if cfg is None:
        return None
    h0, seg = kernel_state(state, segment_pos)
    if grad:
        # the operands kernel inside the layer's one autograd Function
        return fused_autograd.fused_layer_params(
            x.contiguous(), *(p.contiguous() for p in params), cfg, seg=seg, h0=h0)
    # the controller's operands and gamma ([2, 2M+1], [2], [M]), kept between no-grad calls
    if operands_cache is not None:
        dirs, scales, gamma = operands_cache.get(params)
    else:
        dirs, scales, gamma = operands(params)
    return fused_autograd.fused_layer(
        x.contiguous(), dirs, scales, gamma, params.nu_log.contiguous(),
        params.theta_log.contiguous(), cfg, seg=seg, h0=h0)


def fits(x: torch.Tensor, params: SAMUParams, state: Optional[State],
         segment_pos: Optional[torch.Tensor]) -> bool:
    """Whether the fused kernels take this call's inputs: x in bf16 / fp16 / fp32 on CUDA (or
    the CPU under the interpreter), fp32 parameters, integer segment_pos [B, L] and state
    [B, M] on x's device (anything else takes the unfused path, whose validation names it)."""
    if (x.dtype not in FUSED_DTYPES or not (x.is_cuda or settings().interpret)
            or any(p.dtype != torch.float32 for p in params)):
        return False
    B, L, width = x.shape
    if segment_pos is not None and (
            tuple(segment_pos.shape) != (B, L) or segment_pos.is_floating_point()
            or segment_pos.dtype == torch.bool or segment_pos.device != x.device):
        return False
    return state is None or all(
        tuple(h.shape) == (B, width // 2) and h.device == x.device for h in state)


def kernel_state(state: Optional[State], segment_pos: Optional[torch.Tensor]):
    """(h0 as a contiguous fp32 pair or None, segment_pos contiguous or None): as the fused
    kernels read them."""
    h0 = None if state is None else tuple(h.to(torch.float32).contiguous() for h in state)
    return h0, segment_pos.contiguous() if segment_pos is not None else None
