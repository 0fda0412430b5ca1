"""Strategy ``lookback_staged``: the look-back scan that stages each chunk in shared memory in
both directions, so that training reads every input once.

The forward is ``lookback_once``'s (br, bi staged: :mod:`samu_tune.kernels.lookback_once`);
the backward stages d out the same way (:mod:`samu_tune.kernels.lookback_once_backward`)
where ``lookback_once`` runs the Triton loop walk, which reads d out twice (from DRAM at
large shapes: at (8, 8192, 1024) on an H100 it read 808 MB for 537 needed, its DRAM at 84%
of peak).  Training on an H100 against ``lookback_once``'s picks: 0.85-0.89 of the time at
six grid shapes, 80% of copy bandwidth at (8, 8192, 1024) (docs/performance.md).  Configs:
``lookback_once``'s with the Triton walk's fields at their defaults (rows 1, stages 1,
look-back width 1; the Gluon kernels poll a fixed number of predecessors).  CUDA only,
sm_80+, decoupled look-back (float atomics), M a multiple of 8; a backward whose rows are
not 16-byte aligned, or of mixed element sizes, runs the Triton walk instead.
"""
from __future__ import annotations

import functools
import sys

import torch

from samu_tune import scratch as _scratch
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import fast
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import lookback, lookback_config, lookback_once
from samu_tune.ops.scan.strategies.lookback_config import LookbackConfig
from samu_tune.registry import Strategy, register

try:
    from samu_tune.kernels import lookback_once_backward as backward_kernels
except ImportError:              # a Triton without Gluon: the strategy is not registered
    backward_kernels = None


def valid(problem: ScanProblem, cfg: LookbackConfig) -> bool:
    """A ``lookback_once`` config whose Triton-walk fields are at their defaults."""
    return (cfg.rows == 1 and cfg.stages == 1 and cfg.lookback_width == 1
            and lookback_once.valid(problem, cfg))


def default(problem: ScanProblem) -> LookbackConfig:
    """Forward: ``lookback_once``'s (64-step chunks of 128 modes).  Training: 32-step chunks
    of 256 modes where B M >= 8192 and M >= 256, else 64-step chunks of 128 modes: on an H100
    the former ran (8, 8192, 1024) in 0.557 ms against 0.580 for the latter, and the grid's
    fastest training configs at (1, 16384, 256) and (2, 65536, 128) are the latter
    (docs/performance.md)."""
    base = dict(inner="loop", lookback="decoupled")
    if problem.backward and problem.M >= 256 and problem.B * problem.M >= 8192:
        block_m, num_warps = lookback_once.fitted_tile(problem.M, 256, 2)
        candidates = [dict(chunk=32, block_m=block_m, num_warps=num_warps)]
    else:
        candidates = []
    candidates += [dict(chunk=64, block_m=128, num_warps=2),
                   dict(chunk=32, block_m=128, num_warps=2)]
    for fields in candidates:
        cfg = LookbackConfig(**base, **fields)
        if valid(problem, cfg):
            return cfg
    return LookbackConfig(**base, **candidates[-1])


@functools.lru_cache(maxsize=256)
def _keywords(plan: lookback.LookbackPlan, has_h0: bool, has_end: bool, itemsize: int) -> dict:
    """The Gluon backward's keywords per specialisation (one dict, kept: the direct launch
    keys it by identity); the copy and look-back constants are the forward's."""
    vec = 16 // itemsize
    return dict(HAS_H0=has_h0, HAS_END=has_end, CHUNK=plan.chunk, BLOCK_M=plan.block_m,
                GROUPS=lookback_once._COPY_GROUPS, UNROLL=lookback_once._UNROLL[plan.chunk],
                VEC=vec, WIDTH=lookback_once._LOOKBACK_WIDTH,
                COPY_COLS=min(32, plan.block_m // vec), num_warps=plan.num_warps,
                **LAUNCH_OPTIONS)


def can_run_backward(M: int, *rows: torch.Tensor) -> bool:
    """Whether a backward can run the Gluon kernel: every row array (d out, the saved
    outputs, grad b) 16-byte aligned and of one element size, M a multiple of 8."""
    return (len({t.element_size() for t in rows}) == 1
            and lookback_once.can_run(M, *rows))


def _launch_backward(plan: lookback.LookbackPlan, B: int, L: int, M: int, *, nu_log,
                     theta_log, ctl, x, h0, y, end, gx, gh0, g_ctl, g_spec, sync,
                     kept: bool) -> bool:
    """The Gluon backward on a look-back launch's head and summaries (the plan's ``backward``:
    :class:`samu_tune.ops.scan.strategies.lookback._LookbackScan` sets them up); False
    where it cannot run (:func:`can_run_backward`), and the Triton walk runs instead."""
    if not can_run_backward(M, *x, *y, *gx):
        return False
    slots, carry_words, nmt, nch, _ = lookback._launch_spec(
        plan, True, B, L, M, False, h0[0] is not None, False, False, end[0] is not None, False)
    dev = x[0].device
    carry = (_scratch.fp32("carry", carry_words, dev) if kept
             else torch.empty(carry_words, dtype=torch.float32, device=dev))
    kwargs = _keywords(plan, h0[0] is not None, end[0] is not None, x[0].element_size())
    with _scratch.Head(sync, 0, slots, dev, kept) as (sync, ticket0, status0):
        _kernel.launch((slots,), (
            sync, carry, ctl, nu_log, theta_log, x[0], x[1], h0[0], h0[1], y[0], y[1], end[0],
            end[1], gx[0], gx[1], gh0[0], gh0[1], g_ctl[0], g_ctl[1], g_spec[0], g_spec[1], B,
            L, M, nmt, nch, ticket0, status0), kwargs)
    return True


def plan_of(cfg: LookbackConfig) -> lookback.LookbackPlan:
    """``lookback_once``'s plan with the staged backward."""
    return lookback.LookbackPlan.of(cfg, once=True, backward=_launch_backward)


def run(inputs, cfg: LookbackConfig):
    return lookback.lookback_scan(inputs, plan_of(cfg))


if backward_kernels is not None and lookback_once.once_kernels is not None:
    _kernel = fast(backward_kernels.lookback_once_backward)
    STRATEGY = register(Strategy(
        name="lookback_staged",
        description="lookback_once whose backward stages d out in shared memory too (Gluon): "
                    "training reads every input once; CUDA sm_80+",
        capability=lookback_once.STRATEGY.capability,
        run=run,
        config_model=LookbackConfig,
        valid=valid,
        default=default,
        fit=lookback_once.fit,
        workspace_bytes=lookback.workspace_bytes,
        priority=9,
        modules=(sys.modules[__name__], lookback_config, sys.modules[lookback.__name__],
                 sys.modules[lookback_once.__name__], lookback_once.occupancy,
                 lookback_once.once_kernels, lookback_once.once_parts, backward_kernels,
                 *lookback.KERNEL_MODULES),
        autograd=lambda cfg: (lookback._LookbackScan, plan_of(cfg)),
    ))
