"""Config base, launch code, autograd and registration shared by the chunk family (``chunk``,
``hierarchical``, ``grouped``).

One scan (forward, or backward with REVERSE) is three stages:

1. :func:`~samu_tune.kernels.chunk.chunk_summary`: each (row, chunk, mode tile) -> its map
   z -> P z + Q, [B, n_chunks, M] fp32;
2. a prefix over those maps -> each chunk's carry-in (and the forward final state): flat
   serial (``chunk``), blocked log-depth (``hierarchical``) or grouped three-level
   (``grouped``), see :mod:`samu_tune.kernels.prefix`;
3. :func:`~samu_tune.kernels.chunk.chunk_replay`: each (row, chunk, mode tile) -> its states;
   backward also every gradient.

The backward is the same three stages with REVERSE=True on d out, starting from the
final-state gradient, reading the saved forward outputs as h[t-1].  Control and spectrum
gradients are per-program partials reduced here with torch (deterministic), or float atomics
(``reduce="atomic"``, which ``valid`` rejects in deterministic mode).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune import intmath
from samu_tune.kernels import chunk as chunk_kernels, chunk_walk, complex_math, tile
from samu_tune.kernels import prefix as prefix_kernels
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import Strategy, register
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune import alloc as _alloc, autograd as _grads
from samu_tune.launch_options import LAUNCH_OPTIONS

KERNEL_MODULES = (chunk_kernels, chunk_walk, prefix_kernels, complex_math, tile)

Chunk = Literal[16, 32, 64, 128]
BlockM = Literal[16, 32, 64, 128]
Warps = Literal[2, 4, 8]
Reduce = Literal["partials", "atomic"]
Intra = Literal["scan", "walk"]
Stages = Literal[1, 2, 4]



class ChunkFamilyConfig(BaseModel):
    """The fields every chunk-family config has.

    ``chunk``: time steps per tile; ``block_m``: modes per tile; ``num_warps``: warps of the
    tile programs; ``reduce``: backward control/spectrum gradients as per-program partials
    summed by torch (deterministic) or float atomics; ``intra``: each chunk by an associative
    scan of its [chunk, block_m] tile, or by a rolled walk of its steps on a [block_m] vector;
    ``num_stages``: software pipelining depth of the walk (1 for the scan)."""

    model_config = ConfigDict(frozen=True)

    chunk: Chunk = 32
    block_m: BlockM = 32
    num_warps: Warps = 4
    reduce: Reduce = "partials"
    intra: Intra = "scan"
    num_stages: Stages = 1


# elements of a [CHUNK, BLOCK_M] tile per thread: below 1 threads idle; above 8 the sm_90
# builds of the backward replay spill (ptxas: docs/performance.md)
_MAX_PER_THREAD = 8


def valid_common(problem: ScanProblem, cfg) -> bool:
    """Prune tiles mostly beyond M or L, tiles that leave threads idle or spill, atomics in
    deterministic mode, and the reduce choice when there is no backward to reduce."""
    if cfg.block_m > max(16, intmath.next_power_of_2(problem.M)):
        return False
    if cfg.chunk > max(16, intmath.next_power_of_2(problem.L)):
        return False
    if cfg.intra == "scan":
        per_thread = cfg.chunk * cfg.block_m // (32 * cfg.num_warps)
        if not 1 <= per_thread <= _MAX_PER_THREAD:
            return False
    elif 32 * cfg.num_warps > max(4 * cfg.block_m, 128):
        # a walk holds only a [BLOCK_M] vector; up to 4 threads per mode are allowed so that
        # coordinate descent can switch ``intra`` from any default without changing warps
        return False
    if cfg.reduce == "atomic" and (problem.deterministic or not problem.backward):
        return False
    if cfg.num_stages > 1 and (cfg.intra != "walk" or cfg.num_stages > cfg.chunk // 4):
        return False   # pipelining is for the walk's loop, a few steps of the chunk ahead
    return True


def default_common(problem: ScanProblem) -> dict:
    """Tile scan, chunk 32 (16 for short rows), 32-mode tiles (16 for M <= 16), warps for 8
    tile elements per thread (at least 2)."""
    chunk = 16 if problem.L <= 16 else 32
    block_m = 16 if problem.M <= 16 else 32
    warps = max(2, chunk * block_m // (32 * _MAX_PER_THREAD))
    return dict(chunk=chunk, block_m=block_m, num_warps=warps, reduce="partials", intra="scan",
                num_stages=1)


def n_chunks(L: int, chunk: int) -> int:
    return intmath.cdiv(L, chunk)


def workspace_bytes_common(problem: ScanProblem, cfg, prefix: str, group: int = 0) -> int:
    """Extra fp32 device bytes per direction held at once: chunk maps 4 x [B, nc, M], carries
    2 x [B, nc, M], final state 2 x [B, M]; grouped adds group maps and carries
    6 x [B, ng, M]; training adds control partials 2 x [B, L, n_mblocks] and spectrum
    partials 2 x [B, nc, M] (atomic: 2 x [B, L] + 2 x [M]) and grad h0 / a zero final-state
    gradient 4 x [B, M]."""
    B, L, M = problem.B, problem.L, problem.M
    nc = n_chunks(L, cfg.chunk)
    words = 6 * B * nc * M + 2 * B * M
    if prefix == "grouped":
        words += 6 * B * intmath.cdiv(nc, group) * M
    if problem.backward:
        if cfg.reduce == "atomic":
            words += 2 * B * L + 2 * M
        else:
            words += 2 * B * L * intmath.cdiv(M, cfg.block_m) + 2 * B * nc * M
        words += 4 * B * M
    return 4 * words


@dataclass(frozen=True)
class ChunkPlan:
    """Launch parameters of one chunk-family scan."""

    chunk: int
    block_m: int
    num_warps: int
    prefix: str          # "serial" | "hierarchical" | "grouped"
    prefix_block: int    # hierarchical: chunks per log-depth block; grouped: chunks per group
    atomic: bool
    walk: bool           # walk each chunk's steps instead of scanning its tile
    num_stages: int      # software pipelining depth of the walk

    @classmethod
    def of(cls, cfg, prefix: str, prefix_block: int = 0) -> "ChunkPlan":
        return cls(cfg.chunk, cfg.block_m, cfg.num_warps, prefix, prefix_block,
                   cfg.reduce == "atomic", cfg.intra == "walk", cfg.num_stages)


def _f32(*shape, device) -> torch.Tensor:
    return _alloc.empty(*shape, dtype=torch.float32, device=device)


# a [BLOCK_C, BLOCK_M] prefix block (hierarchical, grouped) at up to 8 warps keeps at most 16
# elements per thread: sm_90 builds spill beyond that
MAX_PREFIX_TILE = 16 * 32 * 8


def prefix_tile_ok(prefix_block: int, block_m: int) -> bool:
    return prefix_block * block_m <= MAX_PREFIX_TILE


def _prefix_warps(rows: int, block_m: int) -> int:
    """Warps for a [rows, BLOCK_M] prefix tile: about 16 elements per thread, 1 to 8."""
    return max(1, min(8, rows * block_m // (32 * 16)))


def _prefix(plan: ChunkPlan, B: int, M: int, nc: int, pq, init, carry, end) -> None:
    """carry[c] (and end, when given) from the chunk maps ``pq`` and ``init`` (or 0)."""
    dev = carry[0].device
    nmb = intmath.cdiv(M, plan.block_m)
    has_init, write_end = init[0] is not None, end[0] is not None
    warps = _prefix_warps(1 if plan.prefix == "serial" else plan.prefix_block, plan.block_m)
    serial_warps = _prefix_warps(1, plan.block_m)
    if plan.prefix == "serial":
        prefix_kernels.prefix_serial[(B * nmb,)](
            *pq, init[0], init[1], carry[0], carry[1], end[0], end[1], M, nc,
            HAS_INIT=has_init, WRITE_END=write_end, BLOCK_M=plan.block_m, num_warps=warps,
            **LAUNCH_OPTIONS)
    elif plan.prefix == "hierarchical":
        prefix_kernels.prefix_blocked[(B * nmb,)](
            *pq, init[0], init[1], carry[0], carry[1], end[0], end[1], M, nc,
            HAS_INIT=has_init, WRITE_END=write_end, BLOCK_C=plan.prefix_block,
            BLOCK_M=plan.block_m, num_warps=warps, **LAUNCH_OPTIONS)
    else:
        ng = intmath.cdiv(nc, plan.prefix_block)
        gpq = tuple(_f32(B, ng, M, device=dev) for _ in range(4))
        gcarry = (_f32(B, ng, M, device=dev), _f32(B, ng, M, device=dev))
        grid = (B * ng * nmb,)
        prefix_kernels.group_scan[grid](
            *pq, *gpq, gcarry[0], gcarry[1], carry[0], carry[1], M, nc, ng,
            EXPAND=False, GROUP=plan.prefix_block, BLOCK_M=plan.block_m, num_warps=warps,
            **LAUNCH_OPTIONS)
        prefix_kernels.prefix_serial[(B * nmb,)](
            *gpq, init[0], init[1], gcarry[0], gcarry[1], end[0], end[1], M, ng,
            HAS_INIT=has_init, WRITE_END=write_end, BLOCK_M=plan.block_m,
            num_warps=serial_warps, **LAUNCH_OPTIONS)
        prefix_kernels.group_scan[grid](
            *pq, *gpq, gcarry[0], gcarry[1], carry[0], carry[1], M, nc, ng,
            EXPAND=True, GROUP=plan.prefix_block, BLOCK_M=plan.block_m, num_warps=warps,
            **LAUNCH_OPTIONS)


def _scan(plan: ChunkPlan, reverse: bool, B: int, L: int, M: int, *, eta, delta, nu_log,
          theta_log, seg, x, y, init, end=(None, None), h=(None, None), h0=(None, None),
          gh0=(None, None), g_ctl=(None, None), g_spec=(None, None)) -> None:
    """One direction: summary -> prefix -> replay."""
    dev = x[0].device
    nc = n_chunks(L, plan.chunk)
    nmb = intmath.cdiv(M, plan.block_m)
    grid = (B * nc * nmb,)
    pq = tuple(_f32(B, nc, M, device=dev) for _ in range(4))
    common = dict(HAS_RESETS=seg is not None, REVERSE=reverse, WALK=plan.walk, CHUNK=plan.chunk,
                  BLOCK_M=plan.block_m, NUM_STAGES=plan.num_stages, num_warps=plan.num_warps,
                  num_stages=plan.num_stages, **LAUNCH_OPTIONS)
    chunk_kernels.chunk_summary[grid](eta, delta, nu_log, theta_log, seg, x[0], x[1], *pq,
                                      L, M, nc, nmb, **common)
    carry = (_f32(B, nc, M, device=dev), _f32(B, nc, M, device=dev))
    _prefix(plan, B, M, nc, pq, init, carry, end)
    chunk_kernels.chunk_replay[grid](
        eta, delta, nu_log, theta_log, seg, x[0], x[1], carry[0], carry[1], y[0], y[1],
        h[0], h[1], h0[0], h0[1], gh0[0], gh0[1], g_ctl[0], g_ctl[1], g_spec[0], g_spec[1],
        L, M, nc, nmb, HAS_H0=h0[0] is not None, ATOMIC=plan.atomic, **common)


def _forward(plan: ChunkPlan, seg, eta, delta, nu_log, theta_log, br, bi, h0, out, last):
    B, L, M = br.shape
    _scan(plan, False, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
          seg=seg, x=(br, bi), y=out, init=h0, end=last)
    return None


def _grad_buffers(plan: ChunkPlan, B: int, L: int, M: int, dev: torch.device):
    """Zeroed sums for the float atomics; else per-program partials (over mode tiles /
    chunks and batch rows, summed by torch)."""
    if plan.atomic:
        g_ctl = _grads.Stacked.empty(B, L, dtype=torch.float32, device=dev)
        g_spec = _grads.Stacked.empty(M, dtype=torch.float32, device=dev)
        g_ctl.whole.zero_()
        g_spec.whole.zero_()
        return g_ctl, g_spec
    nc, nmb = n_chunks(L, plan.chunk), intmath.cdiv(M, plan.block_m)
    return _grads.partials(B, L, nmb, (B, nc, M), dev)


def _backward(plan: ChunkPlan, seg, eta, delta, nu_log, theta_log, h0, out, _aux, d_out,
              d_last, grad_b, gh0, g_ctl, g_spec) -> None:
    B, L, M = out[0].shape
    _scan(plan, True, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
          seg=seg, x=d_out, y=grad_b, init=d_last, h=out, h0=h0, gh0=gh0, g_ctl=g_ctl,
          g_spec=g_spec)


_ChunkScan = _grads.scan_function(
    "_ChunkScan", "Autograd of a chunk-family scan; outputs (out_r, out_i, last_r, last_i).",
    forward_launch=_forward, backward_launch=_backward, grad_buffers=_grad_buffers,
    reduce=lambda plan, g_ctl, g_spec: (
        (*g_ctl, *g_spec) if plan.atomic else _grads.sum_partials(g_ctl, g_spec)))


def chunk_scan(inputs: ScanInputs, plan: ChunkPlan) -> ScanOutput:
    """Run the chunk-family scan of ``plan`` on validated ``inputs`` (differentiable)."""
    return _grads.apply_scan(_ChunkScan, inputs, plan)


# member -> (prefix over chunk maps, config field holding its block / group size)
MEMBERS = {"chunk": ("serial", None), "hierarchical": ("hierarchical", "prefix_block"),
           "grouped": ("grouped", "group")}


def plan_for(name: str, cfg: ChunkFamilyConfig) -> ChunkPlan:
    """The launch plan of member ``name`` under ``cfg``."""
    prefix, field = MEMBERS[name]
    return ChunkPlan.of(cfg, prefix, getattr(cfg, field) if field else 0)


def register_member(name: str, *, description: str, config_model: type[ChunkFamilyConfig],
                    valid: Callable[[ScanProblem, ChunkFamilyConfig], bool],
                    default: Callable[[ScanProblem], ChunkFamilyConfig], priority: int,
                    module: str) -> Strategy:
    """Register chunk-family member ``name`` (see :data:`MEMBERS`): its run and workspace come
    from the plan; ``module`` (the member's ``__name__``) is hashed with this module and the
    kernels."""

    def run(inputs: ScanInputs, cfg: ChunkFamilyConfig) -> ScanOutput:
        return chunk_scan(inputs, plan_for(name, cfg))

    def workspace_bytes(problem: ScanProblem, cfg: ChunkFamilyConfig) -> int:
        plan = plan_for(name, cfg)
        return workspace_bytes_common(problem, cfg, plan.prefix, plan.prefix_block)

    return register(Strategy(
        name=name,
        description=description,
        capability=Capability(),
        run=run,
        config_model=config_model,
        valid=valid,
        default=default,
        workspace_bytes=workspace_bytes,
        priority=priority,
        modules=(sys.modules[module], sys.modules[__name__], *KERNEL_MODULES),
        autograd=lambda cfg: (_ChunkScan, plan_for(name, cfg)),
    ))
