"""Strategy ``lookback``: single-pass chunked scan with decoupled look-back.

One program per (batch row, mode tile, time chunk) scans its [CHUNK, BLOCK_M] tile in
registers, learns the state entering its chunk from its predecessors' published summaries
(:mod:`samu_tune.kernels.lookback`) and writes its outputs: inputs are read once, outputs
written once, and the whole GPU is busy even when B * M is small and L long.  Forward and
backward are the one kernel (``REVERSE``).

``lookback="decoupled"`` composes predecessor aggregates in a timing-dependent order (tiny
floating-point differences between runs): ``valid`` rejects it when the problem asks for
determinism.  ``lookback="chained"`` has one fixed combination order, bitwise reproducible:
every ``window``-th chunk publishes only its inclusive prefix, the others only their
aggregate, so a chunk composes the aggregates back to the previous window start and its
prefix (window 1: wait for the immediate predecessor's prefix, a chain of n_chunks hops;
window W: a chain W times shorter).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict

from .. import intmath
from ..kernels import chunk_walk, complex_math, controls, lookback as lookback_kernels, tile
from ..problem import TORCH_DTYPES, ScanProblem
from ..registry import Capability, Strategy, register
from ..tensors import ScanInputs, ScanOutput
from . import _alloc, _grads, controller
from ..launch_options import LAUNCH_OPTIONS
from ..launcher import fast

# the scan kernel, launched directly after its first launch per specialisation
_scan_kernel = fast(lookback_kernels.lookback_scan)

# register budget, in tile elements per thread.  Above 8 per thread the tile configs spill
# (ptxas, sm_90), yet spilling 32-per-thread configs beat the 8-per-thread ones at
# (8, 8192, 1024) on the H200 (docs/performance.md), so up to 32 per thread stay in the
# space and the tuner decides.
_MAX_TILE = 8192
_MAX_PER_THREAD = 32
_MAX_TILE_BLOCK_M = 128

# loop-inner configs (``inner="loop"``): rows walked per program and lanes per thread.  A
# thread holds a few [BLOCK_M]-vectors, whatever the chunk; the lanes per thread set the
# bytes each thread has in flight per row (a row's controls come from a per-token table, the
# next row's loads are issued before the current row's math).  Up to 8 lanes per thread
# compile for sm_90 without spills (registers per config: docs/performance.md).
_LOOP_CHUNKS = (32, 64, 128)
_LOOP_LANES_PER_THREAD = (2, 4, 8)
_LOOP_WARPS = (2, 4)
# rows per walk step (``rows`` 2: both rows' loads issued together, then the two dependent
# steps: twice the bytes in flight per program) at 2 and 4 lanes per thread, chunks up to 64
# (8 more configs).  Two rows raise the registers 1.3-1.9x without spills (sm_90), so fewer
# programs are resident: the tuner weighs it.  8 lanes per thread, already the most
# registers at one row, are left out (registers per config: docs/performance.md).
_LOOP_ROWS2_LANES = (2, 4)
_LOOP_ROWS2_MAX_CHUNK = 64

# look-back width (``lookback_width``, decoupled only): predecessors read per look-back poll,
# their statuses in one vector atomic and their payloads in one L2 round trip, so a walk over
# n predecessors takes ~n / width polls instead of n.  A poll holds width x 4 payload vectors
# of the lanes a thread owns (fp32).  ptxas for sm_90 issues them all before the first use
# while width x lanes per thread <= 16; beyond that it spills and serialises the loads (a
# round trip per row) (registers and spills per config: docs/performance.md).
# A width pays only where a walk can be longer than the next narrower width covers in a poll.
_MAX_WIDTH_LANES = 16
_WIDTH_BELOW = {8: 1, 16: 8}

# software-pipeline stages of the loop walks (``stages`` > 1): Triton's pipeliner copies the
# next stages - 1 steps' rows and controls into shared memory with cp.async (checked in the
# PTX of Triton 3.6: every row and control load of both walks, forward and backward), so a
# program has stages - 1 steps in flight without registers to hold them.  The staged bytes
# per program (stages x rows x the row arrays of a step) stay under _MAX_STAGED_BYTES so that
# shared memory leaves room for several programs per SM.  Stages 4-6 beat the register
# prefetch by 10-25% on the H200 at 64-step chunks of 2-4 lanes per thread; shorter walks are
# mostly prologue, and each stage costs registers, hence the limits below
# (docs/performance.md).
_MAX_STAGED_BYTES = 48 * 1024
_STAGED_MIN_CHUNK = 64
_STAGED_MAX_LANES = 4


class LookbackConfig(BaseModel):
    """Launch choices of the look-back scan.

    ``chunk``: time steps per program; ``block_m``: modes per program; ``num_warps``: warps
    per program; ``lookback``: ``decoupled`` (predecessor aggregates, fast, not bitwise
    reproducible) or ``chained`` (fixed combination order, deterministic); ``window``:
    chunks per published inclusive prefix in chained mode (1 in decoupled mode); ``sub``:
    tiles of ``chunk`` steps per program (a program's chunk is ``chunk * sub`` steps: sub > 1
    walks its tiles twice, summary then replay, for more bytes in flight per program and a
    ``sub`` times shorter look-back chain).  ``inner``: ``tile`` scans each [chunk, block_m]
    tile in registers (tl.associative_scan); ``loop`` walks the program's ``chunk * sub`` rows
    ``rows`` at a time on [block_m] vectors, twice (summary, then replay re-reading the inputs,
    from L2 while the chunks in flight fit it): few registers per thread, high occupancy.
    ``rows`` (loop only): rows per step of the loop-inner walks, their loads issued together
    (2: twice the bytes in flight per program, for 1.3-1.9x the registers: see
    ``_LOOP_ROWS2_LANES``).  ``lookback_width``
    (decoupled only): predecessors read per look-back poll (one vector status atomic, their
    payloads in one round trip: see ``_MAX_WIDTH_LANES``).  ``stages`` (loop only): 1, each
    walk step loads the next step's rows into registers; N > 1, the next N - 1 steps' rows
    are staged in shared memory by Triton's software pipeliner (cp.async): more bytes in
    flight per program without registers to hold the rows (the staging itself costs ~10-14
    registers per stage; see ``_MAX_STAGED_BYTES``).
    """

    model_config = ConfigDict(frozen=True)

    chunk: Literal[16, 32, 64, 128, 256] = 64
    block_m: Literal[16, 32, 64, 128, 256, 512, 1024] = 32
    num_warps: Literal[2, 4, 8] = 4
    lookback: Literal["decoupled", "chained"] = "decoupled"
    window: Literal[1, 8, 32] = 1
    sub: Literal[1, 4, 16] = 1
    inner: Literal["tile", "loop"] = "tile"
    rows: Literal[1, 2] = 1
    lookback_width: Literal[1, 8, 16] = 1     # predecessors per look-back poll (decoupled)
    stages: Literal[1, 4, 6] = 1     # loop walks: software-pipeline depth


def lanes_per_thread(cfg) -> int:
    """Modes of a [block_m] row vector each thread holds (loop-inner: per row)."""
    return cfg.block_m // (32 * cfg.num_warps)


def staged_bytes(problem: ScanProblem, cfg: LookbackConfig) -> int:
    """Shared memory the software pipeline of a loop config stages per program (0 at
    stages 1): stages steps of ``rows`` rows of the walk's [block_m] arrays (x; backward also
    the saved h) in the data dtype."""
    if cfg.stages == 1:
        return 0
    arrays = 4 if problem.backward else 2
    itemsize = TORCH_DTYPES[problem.dtype].itemsize
    return cfg.stages * cfg.rows * arrays * cfg.block_m * itemsize


def valid(problem: ScanProblem, cfg: LookbackConfig) -> bool:
    """Prune tiles mostly beyond M or L, tiles over the register budget, threads without
    elements, and decoupled look-back under deterministic mode.  Loop-inner configs: a small
    subspace (``_LOOP_*``: chunk, lanes per thread, warps, rows per step), sub 1, decoupled
    look-back (chained only under deterministic mode), so the tuner tries ~10-26 of them per
    problem (times the look-back widths); ``rows`` 2 only for loop configs of look-back width
    1.  A look-back width > 1: decoupled only, within the register budget
    (``_MAX_WIDTH_LANES``), and only where walks can be longer than a narrower width covers.
    ``stages`` > 1: loop configs of 64+-step chunks at <= 4 lanes per thread whose staged
    rows fit ``_MAX_STAGED_BYTES``."""
    if cfg.block_m > max(16, intmath.next_power_of_2(problem.M)):
        return False
    if cfg.chunk * cfg.sub > max(16, intmath.next_power_of_2(problem.L)):
        return False
    if cfg.inner == "loop":
        if (cfg.chunk not in _LOOP_CHUNKS or cfg.num_warps not in _LOOP_WARPS
                or lanes_per_thread(cfg) not in _LOOP_LANES_PER_THREAD
                or cfg.block_m % (32 * cfg.num_warps) or cfg.sub != 1):
            return False
        if cfg.rows != 1 and (lanes_per_thread(cfg) not in _LOOP_ROWS2_LANES
                              or cfg.chunk > _LOOP_ROWS2_MAX_CHUNK
                              or cfg.lookback_width != 1):    # each doubles the registers
            return False
        if cfg.lookback == "chained" and not problem.deterministic:
            return False
        if cfg.stages > 1 and (cfg.chunk < _STAGED_MIN_CHUNK
                               or lanes_per_thread(cfg) > _STAGED_MAX_LANES
                               or staged_bytes(problem, cfg) > _MAX_STAGED_BYTES):
            return False
    else:
        if cfg.rows != 1 or cfg.stages != 1:
            return False
        tile_elems = cfg.chunk * cfg.block_m
        if (cfg.block_m > _MAX_TILE_BLOCK_M or tile_elems > _MAX_TILE
                or tile_elems > _MAX_PER_THREAD * 32 * cfg.num_warps):
            return False
        if tile_elems < 32 * cfg.num_warps:
            return False
    if cfg.window > 1 and (cfg.lookback == "decoupled"
                           or cfg.window >= n_chunks(problem.L, cfg.chunk * cfg.sub)):
        return False
    if cfg.lookback_width > 1 and (
            cfg.lookback == "chained"
            or n_chunks(problem.L, cfg.chunk * cfg.sub) - 1 <= _WIDTH_BELOW[cfg.lookback_width]
            or cfg.lookback_width * max(1, lanes_per_thread(cfg))
            > _MAX_WIDTH_LANES):
        return False
    return not (problem.deterministic and cfg.lookback == "decoupled")


def default(problem: ScanProblem) -> LookbackConfig:
    """The fastest configs on the H200 in GPU time (docs/performance.md): for M >= 128 and
    L >= 64 the software-pipelined loop walk over 64-step chunks at 2 warps, 6 stages: 256
    modes (4 lanes per thread) one row per step where M >= 256 (20-25% faster than unstaged
    32-step chunks at (8, 8192, 1024)), else 128 modes two rows per step.  Shorter L: 32-step
    loop chunks of up to 512 modes (unstaged: a 32-step walk is mostly pipeline prologue).
    Narrower M: the tile scan, 128-step chunks of 32 modes at 4 warps, shrunk to fit small
    problems.  Under deterministic mode chained, with a window of 8 chunks when there are
    more."""
    mode = "chained" if problem.deterministic else "decoupled"
    if problem.M >= 128 and problem.L >= 64:
        block_m = 256 if problem.M >= 256 else 128
        cfg = LookbackConfig(chunk=64, block_m=block_m, num_warps=2, inner="loop",
                             rows=1 if block_m == 256 else 2, stages=6, lookback=mode,
                             window=8 if mode == "chained" and n_chunks(problem.L, 64) > 8
                             else 1)
        if valid(problem, cfg):
            return cfg
    if problem.M >= 128 and problem.L >= 32:
        block_m = 512 if problem.M >= 512 else 256 if problem.M >= 256 else 128
        cfg = LookbackConfig(chunk=32, block_m=block_m, num_warps=4 if block_m >= 256 else 2,
                             inner="loop", lookback=mode,
                             window=8 if mode == "chained" and n_chunks(problem.L, 32) > 8
                             else 1)
        if valid(problem, cfg):
            return cfg
    chunk, block_m, num_warps = 128, 32, 4
    while chunk > 16 and chunk > problem.L:
        chunk //= 2
    while block_m > 16 and block_m > problem.M:
        block_m //= 2
    while num_warps > 2 and chunk * block_m < 32 * 8 * num_warps:
        num_warps //= 2
    window = 8 if mode == "chained" and n_chunks(problem.L, chunk) > 8 else 1
    return LookbackConfig(chunk=chunk, block_m=block_m, num_warps=num_warps, lookback=mode,
                          window=window)


def n_mode_tiles(M: int, block_m: int) -> int:
    return intmath.cdiv(M, block_m)


def n_chunks(L: int, chunk: int) -> int:
    return intmath.cdiv(L, chunk)


def _words16(n: int) -> int:
    """``n`` 4-byte words rounded up to 16 bytes (every view of a workspace stays 16-byte
    aligned: Triton specialises pointer arguments on it)."""
    return intmath.cdiv(n, 4) * 4


def _slots(B: int, L: int, M: int, cfg) -> int:
    return B * n_mode_tiles(M, cfg.block_m) * n_chunks(L, cfg.chunk * cfg.sub)


def _head_words(B: int, L: int, M: int, cfg) -> int:
    """A launch's zeroed int32 head: the ticket counter and one status per slot."""
    return _words16(1 + _slots(B, L, M, cfg))


def _carry_words(B: int, L: int, M: int, cfg) -> int:
    """A launch's published summaries (fp32, written before read: not zeroed)."""
    return _slots(B, L, M, cfg) * lookback_kernels.SLOT_ROWS.value * cfg.block_m


def _grad_words(B: int, L: int, M: int, fused: bool = False) -> tuple[int, int]:
    """Words of the backward's float-atomic gradient accumulators (zeroed): controls
    2 x [B, L], spectrum 2 x [M] (3 x [M] with the fused layer's gamma)."""
    return _words16(B * L), _words16(M) * (3 if fused else 2)


def workspace_bytes(problem: ScanProblem, cfg: LookbackConfig) -> int:
    """Extra device bytes beyond inputs and outputs: the statuses and summaries of a launch
    and, loop-inner, the control table [B L, 4] fp32; when training, the backward's statuses
    (zeroed with the forward's) and its gradient buffers: decoupled, the atomic accumulators
    2 x [B, L] + 2 x [M]; chained, the partials 2 x [B, L, n_mtiles] and
    2 x [B, n_chunks, M]; and (an upper bound: only when a conversion needs it) a final-state
    gradient 2 x [B, M], all fp32.  The fused layer adds a gamma sum [M]."""
    B, L, M = problem.B, problem.L, problem.M
    words = _head_words(B, L, M, cfg) + _carry_words(B, L, M, cfg)
    if cfg.inner == "loop":
        words += B * L * controls.TABLE_COLS.value
    if problem.backward:
        words += _head_words(B, L, M, cfg) + 2 * B * M
        if cfg.lookback == "decoupled":
            ctl, spec = _grad_words(B, L, M)
            words += 2 * ctl + spec
        else:
            words += (2 * B * L * n_mode_tiles(M, cfg.block_m)
                      + 2 * B * n_chunks(L, cfg.chunk * cfg.sub) * M)
    return 4 * words


@dataclass(frozen=True)
class LookbackPlan:
    """Kernel launch parameters.  ``window`` is the config's in chained mode; in decoupled
    mode it is 1 except in tests, which raise it to drive the aggregate path (see
    :mod:`samu_tune.kernels.lookback`).  ``width``: the look-back's predecessors per poll
    (the config's ``lookback_width`` in decoupled mode; chained mode walks one at a time, its
    fixed combination order)."""

    chunk: int
    block_m: int
    num_warps: int
    decoupled: bool
    window: int = 1
    sub: int = 1
    loop: bool = False
    rows: int = 1
    width: int = 1
    stages: int = 1

    @classmethod
    def of(cls, cfg: LookbackConfig, window: Optional[int] = None) -> "LookbackPlan":
        return _plan_of(cls, cfg, window)

    @property
    def atomic(self) -> bool:
        """Whether the backward float-atomically accumulates the control and spectrum
        gradients (no reduction launches; the sum order varies from run to run): decoupled
        look-back, whose results vary in their last bits already.  Chained look-back (the
        deterministic mode) stores partials that torch reduces in a fixed order."""
        return self.decoupled

    def rebase(self, reverse: bool) -> bool:
        """Whether the loop walks index from pointers rebased at each chunk's first token
        (int32 step offsets: ~25% fewer instructions per element, sm_90 SASS) rather than by
        token.  Not for the backward walk of two rows at more than 2 lanes per thread: there
        the rebased pointers cost one program per SM (registers past an occupancy step) and
        the walk runs slower on the H200 (docs/performance.md)."""
        return not (reverse and self.rows == 2 and lanes_per_thread(self) > 2)


@functools.lru_cache(maxsize=1024)
def _plan_of(cls, cfg: LookbackConfig, window: Optional[int]) -> LookbackPlan:
    """:meth:`LookbackPlan.of`, memoized per (frozen) config: a call's plan costs a lookup."""
    decoupled = cfg.lookback == "decoupled"
    return cls(cfg.chunk, cfg.block_m, cfg.num_warps, decoupled,
               cfg.window if window is None else window, cfg.sub, cfg.inner == "loop",
               cfg.rows, cfg.lookback_width if decoupled else 1, cfg.stages)


def m_align(plan: LookbackPlan, M: int) -> int:
    """The kernel's M_ALIGN: 8 when M is a multiple of 8 and the plan loops (its row loads
    and stores then vectorise; the tile path keeps one binary), else 1."""
    return 8 if plan.loop and M % 8 == 0 else 1


def _launch(plan: LookbackPlan, reverse: bool, B: int, L: int, M: int, *, eta, delta, nu_log,
            theta_log, seg, x, h0, y, end, gx=(None, None), gh0=(None, None),
            p_ctl=(None, None), p_spec=(None, None), ctl=None, gamma=None, o=None, xw=None,
            p_gamma=None, save_h=False, sync=None, make_table=False) -> None:
    """One look-back launch.  ``ctl``: the loop-inner walk's control table [B L, 4] fp32,
    written by the kernel itself when ``make_table`` (forward).  ``sync``: the launch's zeroed
    int32 head (:func:`_head_words`; zeroed here when None).  ``end`` (reverse): the
    final-state gradient pair, or (None, None) for a zero one.  ``p_ctl``, ``p_spec`` (and
    ``p_gamma``): per-program partials, or zeroed atomic accumulators when ``plan.atomic``.
    ``gamma`` given: the SAMU layer fused (see :class:`_FusedLayer`): x = (x or d y
    [B, L, 2M], None), o the layer output or grad x [B, L, 2M], y the states (written when
    ``save_h``), xw the layer input and p_gamma the d gamma partials (backward)."""
    if plan.window < 1:
        raise ValueError(f"window must be >= 1, got {plan.window}")
    if plan.loop and ctl is None:
        raise ValueError("a loop-inner look-back launch needs its control table")
    nmt = n_mode_tiles(M, plan.block_m)
    nch = n_chunks(L, plan.chunk * plan.sub)
    slots = B * nmt * nch
    dev = x[0].device
    # the summaries are fp32, never read before written: no fill
    carry = torch.empty(_carry_words(B, L, M, plan), dtype=torch.float32, device=dev)
    if sync is None:
        sync = torch.zeros(_head_words(B, L, M, plan), dtype=torch.int32, device=dev)
    _scan_kernel[(slots,)](
        sync, carry, eta, delta, nu_log, theta_log, seg, ctl, gamma, o, xw, p_gamma, x[0], x[1],
        h0[0], h0[1], y[0], y[1], end[0], end[1], gx[0], gx[1], gh0[0], gh0[1], p_ctl[0],
        p_ctl[1], p_spec[0], p_spec[1],
        B, L, M, nmt, nch, plan.window,
        HAS_RESETS=seg is not None, HAS_H0=h0[0] is not None, REVERSE=reverse,
        DECOUPLED=plan.decoupled, CHUNK=plan.chunk, BLOCK_M=plan.block_m, SUB=plan.sub,
        LOOP=plan.loop, M_ALIGN=m_align(plan, M), FUSED=gamma is not None, SAVE_H=save_h,
        ROWS=plan.rows, WIDTH=plan.width, REBASE=plan.rebase(reverse),
        STAGES=plan.stages, HAS_END=end[0] is not None, ATOMIC=reverse and plan.atomic,
        MAKE_TABLE=make_table, num_warps=plan.num_warps, **LAUNCH_OPTIONS)


class _Zeroed:
    """The zeroed buffers of a forward and, when training, of its backward, cut from one
    allocation (one fill launch for both directions): the forward's head and, when
    training, the backward's head and, under ``plan.atomic``, its gradient accumulators
    (fp32: controls 2 x [B, L], spectrum 2 x [M], and gamma [M] for the fused layer).  The
    backward's views are cut when the backward runs (:meth:`for_backward`): each view costs
    host time, and a gradient view kept referenced here would make autograd copy it."""

    __slots__ = ("zeroed", "fwd_sync", "head", "used")

    def __init__(self, zeroed: torch.Tensor, head: int, training: bool) -> None:
        self.zeroed, self.head = zeroed, head
        self.fwd_sync = zeroed[:head] if training else zeroed
        self.used = False

    @classmethod
    def of(cls, plan: LookbackPlan, B: int, L: int, M: int, device: torch.device,
           training: bool, fused: bool = False) -> "_Zeroed":
        head = _head_words(B, L, M, plan)
        ctl_w, spec_w = _grad_words(B, L, M, fused) if training and plan.atomic else (0, 0)
        zeroed = torch.zeros(head * (2 if training else 1) + 2 * ctl_w + spec_w,
                             dtype=torch.int32, device=device)
        return cls(zeroed, head, training)

    def for_backward(self, plan: LookbackPlan, B: int, L: int, M: int, device: torch.device,
                     fused: bool = False) -> "_Backward":
        """The backward's head and accumulators: these buffers for the first backward; fresh
        zeroed ones for another backward of the same graph (retain_graph: the first one has
        written statuses and sums)."""
        work = self if not self.used else _Zeroed.of(plan, B, L, M, device, True, fused)
        self.used = True
        head, zeroed = work.head, work.zeroed
        out = _Backward(zeroed[head:2 * head])
        if plan.atomic:
            acc = zeroed.view(torch.float32)     # offsets below count from its storage's start
            at = zeroed.storage_offset() + 2 * head
            ctl_w, m_w = _words16(B * L), _words16(M)
            out.g_ctl = acc.as_strided((2, B, L), (ctl_w, L, 1), at).unbind(0)
            out.g_spec = acc.as_strided((2, M), (m_w, 1), at + 2 * ctl_w).unbind(0)
            if fused:
                out.g_gamma = acc.as_strided((M,), (1,), at + 2 * ctl_w + 2 * m_w)
        return out


def _backward_work(ctx, plan: LookbackPlan, B: int, L: int, M: int, device: torch.device,
                   fused: bool = False) -> "_Backward":
    """The backward's head and accumulators: those its forward zeroed (``ctx.work``), or
    fresh ones where the forward kept none (an operator's backward, :mod:`samu_tune.
    torch_ops`)."""
    work = getattr(ctx, "work", None)
    if work is None:
        work = _Zeroed.of(plan, B, L, M, device, True, fused)
    return work.for_backward(plan, B, L, M, device, fused)


@dataclass
class _Backward:
    """A backward launch's zeroed head and (``plan.atomic``) gradient accumulators."""

    bwd_sync: torch.Tensor
    g_ctl: tuple = (None, None)
    g_spec: tuple = (None, None)
    g_gamma: Optional[torch.Tensor] = None


def _table(plan: LookbackPlan, B: int, L: int, device: torch.device) -> Optional[torch.Tensor]:
    """The loop-inner walk's control table [B L, 4] fp32, to be written by the forward
    kernel (MAKE_TABLE); None for the tile path."""
    if not plan.loop:
        return None
    return _alloc.empty(B * L, controls.TABLE_COLS.value, dtype=torch.float32, device=device)


def _grad_buffers(plan: LookbackPlan, work: "_Backward", B: int, L: int, M: int,
                  device: torch.device, fused: bool = False):
    """The backward's gradient outputs: the zeroed accumulators of ``work`` (atomic), else
    per-program partials (controls [B, L, n_mtiles], spectrum and gamma [B, n_chunks, M])."""
    if plan.atomic:
        return work.g_ctl, work.g_spec, work.g_gamma
    nch = n_chunks(L, plan.chunk * plan.sub)
    p_ctl, p_spec = _grads.partials(B, L, n_mode_tiles(M, plan.block_m), (B, nch, M), device)
    p_gamma = (torch.empty(B, nch, M, dtype=torch.float32, device=device) if fused else None)
    return p_ctl, p_spec, p_gamma


def _reduced(plan: LookbackPlan, g_ctl, g_spec) -> tuple[torch.Tensor, ...]:
    """(grad eta, grad delta, grad nu_log, grad theta_log): the accumulators themselves
    (atomic), else the partials reduced by torch in a fixed order."""
    if plan.atomic:
        return (*g_ctl, *g_spec)
    return _grads.sum_partials(g_ctl, g_spec)


def _incoming(d_out_r, d_out_i, d_last_r, d_last_i, like: torch.Tensor):
    """The incoming gradients with autograd's zero-materialisation off: a missing output
    gradient (its output unused by the loss) is None.  Returns d out (pair, [B, L, M],
    zeros where missing: rare, only the final state used) and d last (fp32 pair, or
    (None, None) when neither half is given: the kernel then starts from zero)."""
    d_out = tuple(torch.zeros_like(like) if d is None else d.contiguous()
                  for d in (d_out_r, d_out_i))
    return d_out, _last_grad(d_last_r, d_last_i)


def _last_grad(d_last_r, d_last_i):
    """The final-state gradient as the kernel reads it: fp32 contiguous pair, or (None, None)
    when autograd passes none (a half missing alone reads as zeros)."""
    if d_last_r is None and d_last_i is None:
        return None, None
    ref = d_last_r if d_last_r is not None else d_last_i
    return tuple(torch.zeros_like(ref, dtype=torch.float32) if d is None
                 else d.to(torch.float32).contiguous() for d in (d_last_r, d_last_i))


class _LookbackScan(torch.autograd.Function):
    """Autograd of the look-back scan; outputs (out_r, out_i, last_r, last_i)."""

    # its backward takes None for an unused output's gradient (materialisation is off)
    accepts_missing_grads = True

    @staticmethod
    def saves_table(plan: LookbackPlan) -> bool:
        """Whether the forward saves the control table [B L, 4] fp32 for backward (loop)."""
        return plan.loop

    @staticmethod
    def forward(ctx, plan: LookbackPlan, seg: Optional[torch.Tensor], eta, delta, nu_log,
                theta_log, br, bi, h0_r, h0_i):
        B, L, M = br.shape
        out_r, out_i = _grads.output_pair(ctx, br, bi)
        last_r, last_i = _grads.pair(ctx, B, M, dtype=torch.float32, device=br.device)
        training = not isinstance(ctx, _grads._NoGradContext)
        work = _Zeroed.of(plan, B, L, M, br.device, training)
        # the loop walk's control table, written by the forward kernel, reused by backward
        ctl = _table(plan, B, L, br.device)
        _launch(plan, False, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
                seg=seg, x=(br, bi), h0=(h0_r, h0_i), y=(out_r, out_i), end=(last_r, last_i),
                ctl=ctl, sync=work.fwd_sync, make_table=plan.loop)
        ctx.plan = plan
        ctx.shape = (B, L, M)
        ctx.dtypes = _grads.dtypes(br, bi, h0_r, h0_i)
        ctx.work = work
        # an unused output's gradient stays None: no zero-filled buffers for the final state
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(seg, eta, delta, nu_log, theta_log, h0_r, h0_i, out_r, out_i, ctl)
        return out_r, out_i, last_r, last_i

    @staticmethod
    def backward(ctx, d_out_r, d_out_i, d_last_r, d_last_i):
        seg, eta, delta, nu_log, theta_log, h0_r, h0_i, out_r, out_i, ctl = ctx.saved_tensors
        plan: LookbackPlan = ctx.plan
        B, L, M = ctx.shape
        dev = out_r.device
        br_dtype, bi_dtype, h0r_dtype, h0i_dtype = ctx.dtypes
        d_out, d_last = _incoming(d_out_r, d_out_i, d_last_r, d_last_i, out_r)
        grad_b, gh0 = _grads.grad_outputs((B, L, M), (br_dtype, bi_dtype), h0_r is not None,
                                          dev)
        work = _backward_work(ctx, plan, B, L, M, dev)
        g_ctl, g_spec, _ = _grad_buffers(plan, work, B, L, M, dev)
        _launch(plan, True, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
                seg=seg, x=d_out, h0=(h0_r, h0_i), y=(out_r, out_i), end=d_last, gx=grad_b,
                gh0=gh0, p_ctl=g_ctl, p_spec=g_spec, ctl=ctl, sync=work.bwd_sync)
        return _grads.input_grads(_reduced(plan, g_ctl, g_spec),
                                  (eta, delta, nu_log, theta_log), grad_b, gh0,
                                  (h0r_dtype, h0i_dtype))


def lookback_scan(inputs: ScanInputs, plan: LookbackPlan) -> ScanOutput:
    """Run the look-back scan of ``plan`` on validated ``inputs`` (differentiable)."""
    return _grads.apply_scan(_LookbackScan, inputs, plan)


def run(inputs: ScanInputs, cfg: LookbackConfig) -> ScanOutput:
    return lookback_scan(inputs, LookbackPlan.of(cfg))


KERNEL_MODULES = (lookback_kernels, chunk_walk, complex_math, controls, tile)

STRATEGY = register(Strategy(
    name="lookback",
    description="single pass: per-chunk tile scan + decoupled look-back over predecessor "
                "summaries; reads inputs once, uses the whole GPU at long L",
    capability=Capability(),
    run=run,
    config_model=LookbackConfig,
    valid=valid,
    default=default,
    workspace_bytes=workspace_bytes,
    priority=11,
    modules=(sys.modules[__name__], *KERNEL_MODULES),
    autograd=lambda cfg: (_LookbackScan, LookbackPlan.of(cfg)),
))


class _FusedLayer(torch.autograd.Function):
    """The SAMU layer: the controller kernels, then the scan with the write and the ReLU
    output fused (loop-inner look-back).

    Inputs: x [B, L, 2M] (bf16 / fp16 / fp32), the controller's dirs [2, 2M + 1] and scales
    [2] (:mod:`samu_tune.strategies.controller`), gamma [M], nu_log, theta_log [M] fp32, h0
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
    def forward(ctx, plan: LookbackPlan, seg, dirs, scales, nu_log, theta_log, x, gamma, h0_r,
                h0_i):
        B, L, width = x.shape
        M = width // 2
        c = controller.forward(x, dirs, scales, table=True, seg=seg)
        y = torch.empty_like(x)
        last_r, last_i = _grads.pair(ctx, B, M, dtype=torch.float32, device=x.device)
        save = _grads.training(ctx)
        h_r, h_i = (_grads.pair(ctx, B, L, M, dtype=x.dtype, device=x.device) if save
                    else (None, None))
        # an operator's backward zeroes its own buffers (ctx.separate)
        work = _Zeroed.of(plan, B, L, M, x.device, save and not getattr(ctx, "separate", False),
                          fused=True)
        _launch(plan, False, B, L, M, eta=c.eta, delta=c.delta, nu_log=nu_log,
                theta_log=theta_log, seg=seg, x=(x, None), h0=(h0_r, h0_i), y=(h_r, h_i),
                end=(last_r, last_i), ctl=c.table, gamma=gamma, o=y, save_h=save,
                sync=work.fwd_sync)
        ctx.plan = plan
        ctx.dtypes = _grads.dtypes(h0_r, h0_i)
        ctx.work = work
        # an unused output's gradient stays None: no zero-filled buffers for the final state
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(seg, dirs, scales, c.eta, c.delta, c.s, nu_log, theta_log, x,
                              gamma, h0_r, h0_i, h_r, h_i, c.table)
        return y, last_r, last_i

    @staticmethod
    def backward(ctx, d_y, d_last_r, d_last_i):
        (seg, dirs, scales, eta, delta, s, nu_log, theta_log, x, gamma, h0_r, h0_i, h_r, h_i,
         ctl) = ctx.saved_tensors
        plan: LookbackPlan = ctx.plan
        B, L, width = x.shape
        M = width // 2
        dev = x.device
        # materialisation off: a gradient of an output the loss does not use is None
        d_y = torch.zeros_like(x) if d_y is None else d_y.contiguous()
        d_last = _last_grad(d_last_r, d_last_i)
        grad_x = torch.empty_like(x)
        gh0 = (_grads.Stacked.empty(B, M, dtype=torch.float32, device=dev)
               if h0_r is not None else (None, None))
        work = _backward_work(ctx, plan, B, L, M, dev, fused=True)
        g_ctl, g_spec, g_gamma = _grad_buffers(plan, work, B, L, M, dev, fused=True)
        _launch(plan, True, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
                seg=seg, x=(d_y, None), h0=(h0_r, h0_i), y=(h_r, h_i), end=d_last,
                gh0=gh0, p_ctl=g_ctl, p_spec=g_spec, ctl=ctl, gamma=gamma, o=grad_x, xw=x,
                p_gamma=g_gamma, sync=work.bwd_sync)
        d_eta, d_delta, g_nu, g_theta = _reduced(plan, g_ctl, g_spec)
        # the controller's grad x added into the scan's (grad_x is written in place)
        _, g_dirs, g_scales = controller.backward(x, dirs, scales, s, d_eta.contiguous(),
                                                  d_delta.contiguous(), grad_x)
        return _grads.input_grads((g_dirs, g_scales, g_nu, g_theta),
                                  (dirs, scales, nu_log, theta_log),
                                  (grad_x, g_gamma if plan.atomic else g_gamma.sum(dim=(0, 1))),
                                  gh0, ctx.dtypes)


def fused_layer(x: torch.Tensor, dirs: torch.Tensor, scales: torch.Tensor, gamma: torch.Tensor,
                nu_log: torch.Tensor, theta_log: torch.Tensor, cfg: LookbackConfig, *,
                seg: Optional[torch.Tensor] = None,
                h0: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The SAMU layer with the controller kernels and the scan's write and ReLU output fused
    (:class:`_FusedLayer`), differentiable in x, dirs, scales, gamma, nu_log, theta_log and
    h0.  All inputs contiguous, parameters fp32; ``cfg`` must be loop-inner (the tile path has
    no fused I/O).  Returns (y, final state).  ValueError on a config that is not a loop-inner
    :class:`LookbackConfig` or on inputs of other shapes, dtypes or devices (the kernels index
    them unchecked; dirs, scales and x are checked by the controller's binding)."""
    if not isinstance(cfg, LookbackConfig) or cfg.inner != "loop":
        raise ValueError(f"the fused SAMU layer needs a loop-inner LookbackConfig, got {cfg!r}")
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"fused SAMU layer: x must be [B, L, 2M], got {list(x.shape)}")
    B, L, width = x.shape
    dev, f32 = x.device, torch.float32
    for what, t in (("gamma", gamma), ("nu_log", nu_log), ("theta_log", theta_log)):
        controller.check_tensor("fused SAMU layer", what, t, (width // 2,), f32, dev)
    for what, t in zip(("h0[0]", "h0[1]"), h0 or ()):
        controller.check_tensor("fused SAMU layer", what, t, (B, width // 2), f32, dev)
    if seg is not None and (tuple(seg.shape) != (B, L) or seg.is_floating_point()):
        raise ValueError(f"fused SAMU layer: seg must be integers [B, L] = {[B, L]}, got "
                         f"{list(seg.shape)} {seg.dtype}")
    h0_r, h0_i = h0 if h0 is not None else (None, None)
    y, last_r, last_i = _grads.apply(_FusedLayer, LookbackPlan.of(cfg), seg, dirs, scales,
                                     nu_log, theta_log, x, gamma, h0_r, h0_i)
    return y, (last_r, last_i)
