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

Long because the autograd function, its launches and their workspace bookkeeping are one unit,
which the ``lookback_once`` strategy shares (its forward launch: ``ONCE_FORWARD``).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from samu_tune import intmath
from samu_tune.kernels import chunk_walk, complex_math, controls, lookback as lookback_kernels, tile
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import Strategy, register
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune import alloc as _alloc, autograd as _grads, scratch as _scratch
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import fast
from samu_tune.ops.scan.strategies import lookback_config

# the scan kernel, launched directly after its first launch per specialisation
_scan_kernel = fast(lookback_kernels.lookback_scan)
# the read-once forward of plans with ``once``: the module :mod:`.lookback_once` (set there),
# whose ``can_run`` says whether a forward launch can take it (else the Triton kernel runs)
# and whose ``launch`` launches it on this launch's head and summaries
ONCE_FORWARD = None

from samu_tune.ops.scan.strategies.lookback_config import (  # noqa: F401  (lookback.valid, ...)
    LookbackConfig, default, lanes_per_thread, n_chunks, n_mode_tiles, valid)


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
    fixed combination order).  ``backward``: a launch that replaces the backward's Triton
    walk, ``backward(plan, B, L, M, nu_log=, theta_log=, ctl=, x=d out, h0=, y=the outputs,
    end=d final state, gx=, gh0=, g_ctl=, g_spec=, sync=, kept=)`` (pairs as :func:`_launch`
    takes them); it returns False where it cannot run, and the walk runs instead."""

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
    once: bool = False
    backward: Optional[Callable[..., bool]] = None

    @classmethod
    def of(cls, cfg: LookbackConfig, window: Optional[int] = None, once: bool = False,
           backward: Optional[Callable[..., bool]] = None) -> "LookbackPlan":
        return _plan_of(cls, cfg, window, once, backward)

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
def _plan_of(cls, cfg: LookbackConfig, window: Optional[int], once: bool,
             backward: Optional[Callable[..., bool]]) -> LookbackPlan:
    """:meth:`LookbackPlan.of`, memoized per (frozen) config: a call's plan costs a lookup.
    ``once``: the forward reads its inputs once (:mod:`.lookback_once`)."""
    decoupled = cfg.lookback == "decoupled"
    return cls(cfg.chunk, cfg.block_m, cfg.num_warps, decoupled,
               cfg.window if window is None else window, cfg.sub, cfg.inner == "loop",
               cfg.rows, cfg.lookback_width if decoupled else 1, cfg.stages, once, backward)


def m_align(plan: LookbackPlan, M: int) -> int:
    """The kernel's M_ALIGN: 8 when M is a multiple of 8 and the plan loops (its row loads
    and stores then vectorise; the tile path keeps one binary), else 1."""
    return 8 if plan.loop and M % 8 == 0 else 1


def _launch(plan: LookbackPlan, reverse: bool, B: int, L: int, M: int, *, eta, delta, nu_log,
            theta_log, seg, x, h0, y, end, gx=(None, None), gh0=(None, None),
            p_ctl=(None, None), p_spec=(None, None), ctl=None, gamma=None, o=None, xw=None,
            p_gamma=None, save_h=False, sync=None, make_table=False, kept=False) -> None:
    """One look-back launch.  ``ctl``: the loop-inner walk's control table [B L, 4] fp32,
    written by the kernel itself when ``make_table`` (forward).  ``sync``: a zeroed int32 head
    (:func:`_head_words`); None: the stream's kept head if ``kept`` (no fill), else a zeroed
    one.  ``end`` (reverse): the final-state gradient pair, or (None, None) for a zero one.
    ``p_ctl``, ``p_spec`` (and ``p_gamma``): per-program partials, or zeroed atomic
    accumulators when ``plan.atomic``.
    ``gamma`` given: the SAMU layer fused (see :class:`samu_tune.ops.layer.fused_autograd.FusedLayer`): x = (x or d y
    [B, L, 2M], None), o the layer output or grad x [B, L, 2M], y the states (written when
    ``save_h``), xw the layer input and p_gamma the d gamma partials (backward).  ``kept``:
    the summaries in a kept scratch buffer (:mod:`samu_tune.scratch`), for eager calls only:
    inside an operator a CUDA-graph tree's warm-up allocates into the graph's private pool,
    whose blocks it reassigns as it sees fit."""
    if plan.loop and ctl is None:
        raise ValueError("a loop-inner look-back launch needs its control table")
    once = (plan.once and not reverse and gamma is None
            and ONCE_FORWARD.can_run(M, x[0], x[1], y[0], y[1]))
    slots, carry_words, nmt, nch, kwargs = _launch_spec(
        plan, reverse, B, L, M, seg is not None, h0[0] is not None, gamma is not None, save_h,
        end[0] is not None, make_table)
    dev = x[0].device
    # fp32 summaries: written before read, never read after the launch (no fill)
    carry = (_scratch.fp32("carry", carry_words, dev) if kept
             else torch.empty(carry_words, dtype=torch.float32, device=dev))
    words = 0 if sync is not None else _head_words(B, L, M, plan)
    # kwargs: the memoized dict of _launch_spec, never changed
    with _scratch.Head(sync, words, slots, dev, kept) as (sync, ticket0, status0):
        if once:
            ONCE_FORWARD.launch(plan, slots, sync, carry, eta, delta, nu_log, theta_log, seg,
                                ctl, x, h0, y, end, B, L, M, nmt, nch, ticket0, status0)
            return
        _scan_kernel.launch((slots,), (
            sync, carry, eta, delta, nu_log, theta_log, seg, ctl, gamma, o, xw, p_gamma, x[0],
            x[1], h0[0], h0[1], y[0], y[1], end[0], end[1], gx[0], gx[1], gh0[0], gh0[1],
            p_ctl[0], p_ctl[1], p_spec[0], p_spec[1],
            B, L, M, nmt, nch, plan.window, ticket0, status0), kwargs)


@functools.lru_cache(maxsize=4096)
def _launch_spec(plan: LookbackPlan, reverse: bool, B: int, L: int, M: int, resets: bool,
                 has_h0: bool, fused: bool, save_h: bool, has_end: bool, make_table: bool):
    """(programs, summary words, mode tiles, chunks, the kernel's keywords) of one look-back
    launch, memoized per call signature: a repeated call reuses them (the keywords are
    passed, never changed)."""
    if plan.window < 1:
        raise ValueError(f"window must be >= 1, got {plan.window}")
    nmt = n_mode_tiles(M, plan.block_m)
    nch = n_chunks(L, plan.chunk * plan.sub)
    kernel = _launch_keywords(plan, reverse, resets, has_h0, fused, save_h, has_end,
                              make_table, m_align(plan, M))
    return B * nmt * nch, _carry_words(B, L, M, plan), nmt, nch, kernel


@functools.lru_cache(maxsize=1024)
def _launch_keywords(plan: LookbackPlan, reverse: bool, resets: bool, has_h0: bool,
                     fused: bool, save_h: bool, has_end: bool, make_table: bool,
                     m_align_: int) -> dict:
    """The kernel's keywords: one dict per specialisation, shared by every shape (the direct
    launch keys a kept dict by identity: :meth:`samu_tune.launcher.FastKernel.launch`)."""
    return dict(
        HAS_RESETS=resets, HAS_H0=has_h0, REVERSE=reverse,
        DECOUPLED=plan.decoupled, CHUNK=plan.chunk, BLOCK_M=plan.block_m, SUB=plan.sub,
        LOOP=plan.loop, M_ALIGN=m_align_, FUSED=fused, SAVE_H=save_h,
        ROWS=plan.rows, WIDTH=plan.width, REBASE=plan.rebase(reverse),
        STAGES=plan.stages, HAS_END=has_end, ATOMIC=reverse and plan.atomic,
        MAKE_TABLE=make_table, num_warps=plan.num_warps, **LAUNCH_OPTIONS)


class _Zeroed:
    """The zeroed buffers of a forward and, when training, of its backward, cut from one
    allocation (one fill launch for both directions): the forward's head and, when
    training, the backward's head and, under ``plan.atomic``, its gradient accumulators
    (fp32: controls 2 x [B, L], spectrum 2 x [M], and gamma [M] for the fused layer).  The
    backward's views are cut when the backward runs (:meth:`for_backward`): each view costs
    host time, and a gradient view kept referenced here would make autograd copy it."""

    __slots__ = ("zeroed", "fwd_sync", "head", "used")

    def __init__(self, zeroed: torch.Tensor, head: int) -> None:
        self.zeroed, self.head = zeroed, head
        # the forward's head is the buffer's first words: the kernel takes its start only
        self.fwd_sync = zeroed
        self.used = False

    @classmethod
    def of(cls, plan: LookbackPlan, B: int, L: int, M: int, device: torch.device,
           training: bool, fused: bool = False) -> "_Zeroed":
        head = _head_words(B, L, M, plan)
        ctl_w, spec_w = _grad_words(B, L, M, fused) if training and plan.atomic else (0, 0)
        zeroed = torch.zeros(head * (2 if training else 1) + 2 * ctl_w + spec_w,
                             dtype=torch.int32, device=device)
        return cls(zeroed, head)

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
            out.g_ctl = (acc.as_strided((B, L), (L, 1), at),
                         acc.as_strided((B, L), (L, 1), at + ctl_w))
            out.g_spec = (acc.as_strided((M,), (1,), at + 2 * ctl_w),
                          acc.as_strided((M,), (1,), at + 2 * ctl_w + m_w))
            if fused:
                out.g_gamma = acc.as_strided((M,), (1,), at + 2 * ctl_w + 2 * m_w)
        return out


def _backward_work(ctx, plan: LookbackPlan, B: int, L: int, M: int, device: torch.device,
                   fused: bool = False) -> "_Backward":
    """The backward's head and accumulators: those its forward zeroed (``ctx.work``), or
    fresh ones where the forward kept none (an operator's backward, :mod:`samu_tune.
    ops.scan.library`)."""
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
        out_r, out_i = _grads.output_pair(br, bi)
        training = not isinstance(ctx, _grads._NoGradContext)
        if not training and ctx.scratch:
            # a no-grad call that returns neither: the final state and the control table in
            # kept scratch buffers
            last_r = _scratch.fp32("last_r", B * M, br.device)
            last_i = _scratch.fp32("last_i", B * M, br.device)
            ctl = (_scratch.fp32("table", B * L * controls.TABLE_COLS.value, br.device)
                   if plan.loop else None)
        else:
            last_r, last_i = _grads.pair(B, M, dtype=torch.float32, device=br.device)
            # the loop walk's control table, written by the forward kernel, reused by backward
            ctl = _table(plan, B, L, br.device)
        eager = not _grads.in_operator(ctx)
        # no backward to come where eager: the head kept for the stream (no zero fill)
        work = None if eager and not training else _Zeroed.of(plan, B, L, M, br.device, training)
        _launch(plan, False, B, L, M, eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log,
                seg=seg, x=(br, bi), h0=(h0_r, h0_i), y=(out_r, out_i), end=(last_r, last_i),
                ctl=ctl, sync=None if work is None else work.fwd_sync, make_table=plan.loop,
                kept=eager)
        if work is None:
            return out_r, out_i, last_r, last_i      # no backward: nothing to keep
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
        kept = not _grads.in_operator(ctx)
        if plan.backward is None or not plan.backward(
                plan, B, L, M, nu_log=nu_log, theta_log=theta_log, ctl=ctl, x=d_out,
                h0=(h0_r, h0_i), y=(out_r, out_i), end=d_last, gx=grad_b, gh0=gh0,
                g_ctl=g_ctl, g_spec=g_spec, sync=work.bwd_sync, kept=kept):
            _launch(plan, True, B, L, M, eta=eta, delta=delta, nu_log=nu_log,
                    theta_log=theta_log, seg=seg, x=d_out, h0=(h0_r, h0_i), y=(out_r, out_i),
                    end=d_last, gx=grad_b, gh0=gh0, p_ctl=g_ctl, p_spec=g_spec, ctl=ctl,
                    sync=work.bwd_sync, kept=kept)
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
    modules=(sys.modules[__name__], lookback_config, *KERNEL_MODULES),
    autograd=lambda cfg: (_LookbackScan, LookbackPlan.of(cfg)),
))
