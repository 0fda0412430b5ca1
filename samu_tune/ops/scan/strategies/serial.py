"""Strategy ``serial``: state in registers, one program per (batch row, mode tile), walk L.

Forward and backward are the one kernel :func:`samu_tune.kernels.serial.serial_scan`
(``REVERSE`` picks the direction).  Every input is read once per direction; the backward reads
the saved outputs as h[t-1].  Control and spectrum gradients come out as per-program partials
reduced here with torch: deterministic, no atomics.

This module also holds the launch code shared with ``precomputed_decay``
(:class:`SerialPlan`, :func:`serial_scan`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune import intmath
from samu_tune.kernels import complex_math, decay, serial as serial_kernels, tile
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import Strategy, register
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune import alloc as _alloc, autograd as _grads
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import fast

# the scan kernel, launched directly after its first launch per specialisation
_scan_kernel = fast(serial_kernels.serial_scan)

# radial_decay tile: 8 tokens x 128 modes, 8 elements per thread at 4 warps
_DECAY_ROWS, _DECAY_MODES, _DECAY_WARPS = 8, 128, 4


class SerialConfig(BaseModel):
    """Launch choices of the serial walk.

    ``block_m``: modes per program; ``num_warps``: warps per program; ``num_stages``: software
    pipelining depth of the time loop (``tl.range(num_stages=...)``: loads of the next steps are
    issued as cp.async into shared memory while the current step computes -- the walk is
    latency-bound, so this is where its time goes); ``unroll``: time-loop unroll factor
    (several steps' independent loads in flight without shared memory).
    """

    model_config = ConfigDict(frozen=True)

    block_m: Literal[16, 32, 64, 128, 256] = 32
    num_warps: Literal[1, 2, 4, 8] = 1
    num_stages: Literal[1, 2, 4, 8] = 1
    unroll: Literal[1, 4] = 1


def valid(problem: ScanProblem, cfg: SerialConfig) -> bool:
    """Prune tiles mostly beyond M, more threads than tile lanes, unrolling or pipelining
    deeper than L."""
    if cfg.block_m > max(16, intmath.next_power_of_2(problem.M)):
        return False
    if cfg.num_warps * 32 > max(cfg.block_m, 32):
        return False
    return cfg.unroll <= problem.L and cfg.num_stages <= problem.L


def default(problem: ScanProblem) -> SerialConfig:
    """Small tiles and one warp: the walk is latency-bound, so more programs hide more of it."""
    return SerialConfig(block_m=16 if problem.M <= 16 else 32, num_warps=1, num_stages=1,
                        unroll=1)


def n_mode_blocks(M: int, block_m: int) -> int:
    return intmath.cdiv(M, block_m)


def workspace_bytes(problem: ScanProblem, cfg: SerialConfig) -> int:
    """Extra device bytes beyond inputs and outputs: when training, the backward's control
    partials 2 x [B, L, n_mblocks], spectrum partials 2 x [B, M] and a zero final-state
    gradient 2 x [B, M], all fp32."""
    B, L, M = problem.B, problem.L, problem.M
    if not problem.backward:
        return 0
    return 4 * (2 * B * L * n_mode_blocks(M, cfg.block_m) + 4 * B * M)


@dataclass(frozen=True)
class SerialPlan:
    """Kernel launch parameters of one serial walk: a config plus the decay choice."""

    block_m: int
    num_warps: int
    num_stages: int
    unroll: int
    precomputed: bool      # read rho [B, L, M] from a parallel radial_decay pass

    @classmethod
    def of(cls, cfg: SerialConfig, *, precomputed: bool) -> "SerialPlan":
        return cls(cfg.block_m, cfg.num_warps, cfg.num_stages, cfg.unroll, precomputed)


def _launch(plan: SerialPlan, reverse: bool, B: int, L: int, M: int, *, eta, delta, nu_log,
            theta_log, seg, rho, x, h0, y, end, gx=(None, None), gh0=(None, None),
            p_ctl=(None, None), p_spec=(None, None)) -> None:
    nmb = n_mode_blocks(M, plan.block_m)
    _scan_kernel[(B * nmb,)](
        eta, delta, nu_log, theta_log, seg, rho, x[0], x[1], h0[0], h0[1], y[0], y[1],
        end[0], end[1], gx[0], gx[1], gh0[0], gh0[1], p_ctl[0], p_ctl[1], p_spec[0], p_spec[1],
        L, M, nmb,
        HAS_RESETS=seg is not None, HAS_H0=h0[0] is not None, PRECOMPUTED=rho is not None,
        REVERSE=reverse, BLOCK_M=plan.block_m, NUM_STAGES=plan.num_stages, UNROLL=plan.unroll,
        num_warps=plan.num_warps, num_stages=plan.num_stages, **LAUNCH_OPTIONS)


def radial_decay(eta: torch.Tensor, nu_log: torch.Tensor, M: int) -> torch.Tensor:
    """rho = exp(-exp(nu_log) e^eta) as [B, L, M] fp32, by the parallel decay kernel."""
    B, L = eta.shape
    rho = _alloc.empty(B, L, M, dtype=torch.float32, device=eta.device)
    grid = (intmath.cdiv(B * L, _DECAY_ROWS), intmath.cdiv(M, _DECAY_MODES))
    decay.radial_decay[grid](eta, nu_log, rho, B * L, M, BLOCK_R=_DECAY_ROWS,
                             BLOCK_M=_DECAY_MODES, num_warps=_DECAY_WARPS, **LAUNCH_OPTIONS)
    return rho


def _forward(plan: SerialPlan, seg, eta, delta, nu_log, theta_log, br, bi, h0, out, last):
    B, L, M = br.shape
    rho = radial_decay(eta, nu_log, M) if plan.precomputed else None
    _launch(plan, False, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
            seg=seg, rho=rho, x=(br, bi), h0=h0, y=out, end=last)
    return rho


def _backward(plan: SerialPlan, seg, eta, delta, nu_log, theta_log, h0, out, rho, d_out,
              d_last, grad_b, gh0, p_ctl, p_spec) -> None:
    B, L, M = out[0].shape
    if plan.precomputed and rho is None:   # not kept by the caller: computed again
        rho = radial_decay(eta, nu_log, M)
    _launch(plan, True, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
            seg=seg, rho=rho, x=d_out, h0=h0, y=out, end=d_last, gx=grad_b, gh0=gh0,
            p_ctl=p_ctl, p_spec=p_spec)


_SerialScan = _grads.scan_function(
    "_SerialScan", "Autograd of the serial walk; outputs (out_r, out_i, last_r, last_i).",
    forward_launch=_forward, backward_launch=_backward,
    # per-program partials: over mode tiles / batch rows, summed by torch
    grad_buffers=lambda plan, B, L, M, dev: _grads.partials(
        B, L, n_mode_blocks(M, plan.block_m), (B, M), dev),
    reduce=lambda plan, p_ctl, p_spec: _grads.sum_partials(p_ctl, p_spec))


def serial_scan(inputs: ScanInputs, plan: SerialPlan) -> ScanOutput:
    """Run the serial walk of ``plan`` on validated ``inputs`` (differentiable)."""
    return _grads.apply_scan(_SerialScan, inputs, plan)


def run(inputs: ScanInputs, cfg: SerialConfig) -> ScanOutput:
    return serial_scan(inputs, SerialPlan.of(cfg, precomputed=False))


KERNEL_MODULES = (serial_kernels, complex_math, tile)

STRATEGY = register(Strategy(
    name="serial",
    description="state in registers, one program per (row, mode tile) walks L; reads inputs once",
    capability=Capability(),
    run=run,
    config_model=SerialConfig,
    valid=valid,
    default=default,
    workspace_bytes=workspace_bytes,
    priority=10,
    modules=(sys.modules[__name__], *KERNEL_MODULES),
    autograd=lambda cfg: (_SerialScan, SerialPlan.of(cfg, precomputed=False)),
))
