"""The in-chunk walk: a chunk's steps one at a time on a [BLOCK_M] vector (``intra="walk"``).

The alternative to scanning the [CHUNK, BLOCK_M] tile with ``tl.associative_scan``: the
program of a (row, chunk, mode tile) walks the chunk's n = min(CHUNK, L - c CHUNK) steps
with a rolled loop, the state in registers (like the serial strategy, but over one chunk
from its carry-in).  Fewer flops and no cross-thread scan, at the price of a dependent
chain of n steps; with B x n_chunks x n_mblocks programs in flight that latency is hidden.

Scan order as in :mod:`samu_tune.kernels.tile`: step r is time t = c CHUNK + r forward,
t = L - 1 - (c CHUNK + r) backward, where the map at t is conj(A[t+1]) (A[L] = 1).  Walking
backward, A[t] computed at one step is the next step's map, so each step evaluates one
transition (plus one before the loop).  NUM_STAGES software-pipelines the walk (loads of
later steps issued while the current one computes), as in the serial strategy.

The look-back scan's loop-inner walk uses two variants instead (constexpr flags, off for the
chunk family): TABLE reads a token's (e^eta, cos delta, sin delta) from a precomputed table
(no per-thread libdevice trig, whose range-reduction branch blocks load hoisting), PREFETCH
issues step r+1's loads (row, controls, backward's h[t-1]) into registers before step r's
arithmetic and stores: one extra row in flight per program, and no shared-memory staging.
ROWS = 2 walks two rows per loop step, the loads of both issued together (two rows in flight
per program).  Not a deeper prefetch: in the sm_90 SASS the loop-carried registers are
copied from the freshly loaded ones at the loop's back edge (or the next step's top), and a
copy waits for its load, so loads issued more than one step ahead would be waited for after
one step anyway.  Deeper is shared memory's job: with PREFETCH off and NUM_STAGES N > 1
(the look-back's ``stages`` config), Triton's pipeliner stages the next N - 1 steps' row and
control loads in shared memory through cp.async (Triton 3.6 PTX: all of them, ROWS 1 and 2,
both walks); each stage costs registers (ptxas sm_90: docs/performance.md).

Addressing: the walks rebase their pointers at the chunk's first token once
(:func:`_chunk_base`) and index steps by int32 distance (:func:`_dist`), or with REBASE off
by token (64-bit products per row and pointer).  The rebased pointers, the exp2 radius of
:func:`~samu_tune.kernels.complex_math.transition_cs` and the contracted
:func:`~samu_tune.kernels.complex_math.cmul_add` cut the instructions per element by about a
quarter on sm_90 (SASS: docs/performance.md).

Long because the walk's summary and replay, forward and backward, share their step helpers,
and the chunk family and the look-back kernels both compile them from here.
"""
import triton
import triton.language as tl

from samu_tune.kernels.complex_math import cmul, cmul_add, cmul_conj, cmul_conj_add, round_like, transition, transition_cs
from samu_tune.kernels.controls import TABLE_COLS
from samu_tune.kernels.tile import transition_gradients


@triton.jit
def _controls_at(eta_ptr, delta_ptr, seg_ptr, tok, HAS_RESETS: tl.constexpr,
                 TABLE: tl.constexpr):
    """The raw controls of token ``tok`` (= b L + t, or relative to pointers rebased at a
    chunk's first token: :func:`_chunk_base`), three fp32 scalars: TABLE (``eta_ptr`` is
    the [B L, 4] control table of :mod:`samu_tune.kernels.controls`, resets applied; delta_ptr,
    seg_ptr unused): (e^eta, cos delta, sin delta); else (eta, delta, keep), keep 0 where a
    reset starts a sequence."""
    if TABLE:
        at = eta_ptr + tok * TABLE_COLS
        return tl.load(at), tl.load(at + 1), tl.load(at + 2)
    eta = tl.load(eta_ptr + tok).to(tl.float32)
    delta = tl.load(delta_ptr + tok).to(tl.float32)
    if HAS_RESETS:
        keep = (tl.load(seg_ptr + tok) != 0).to(tl.float32)
    else:
        keep = 1.0
    return eta, delta, keep


@triton.jit
def _transition_of(c0, c1, c2, nu, cos_theta, sin_theta, HAS_RESETS: tl.constexpr,
                   TABLE: tl.constexpr):
    """A from a token's raw controls (:func:`_controls_at`) for a mode tile: (ar, ai,
    log_radius), [BLOCK_M] each; A = 0 where a reset starts a sequence."""
    if TABLE:
        return transition_cs(nu, cos_theta, sin_theta, c0, c1, c2)
    ar, ai, log_radius = transition(nu, cos_theta, sin_theta, c0, c1)
    if HAS_RESETS:
        ar = tl.where(c2 != 0, ar, 0.0)
        ai = tl.where(c2 != 0, ai, 0.0)
    return ar, ai, log_radius


@triton.jit
def _transition_at(eta_ptr, delta_ptr, seg_ptr, tok, nu, cos_theta, sin_theta,
                   HAS_RESETS: tl.constexpr, TABLE: tl.constexpr):
    """A at token ``tok``: (ar, ai, log_radius), [BLOCK_M] each."""
    c0, c1, c2 = _controls_at(eta_ptr, delta_ptr, seg_ptr, tok, HAS_RESETS, TABLE)
    return _transition_of(c0, c1, c2, nu, cos_theta, sin_theta, HAS_RESETS, TABLE)


@triton.jit
def _add_pair(a0, a1, b0, b1):
    """Combine of a two-operand sum (``tl.reduce`` over a pair of tensors)."""
    return a0 + b0, a1 + b1


@triton.jit
def _time(start, r, L, REVERSE: tl.constexpr):
    """The time of the chunk's step r."""
    if REVERSE:
        return L - 1 - (start + r)
    return start + r


@triton.jit
def _row_loads(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, h_r_ptr, h_i_ptr, t, t0, row, M,
               lane, mask, HAS_RESETS: tl.constexpr, TABLE: tl.constexpr, PREV: tl.constexpr,
               FUSED: tl.constexpr = False, gamma=None, REVERSE: tl.constexpr = False,
               REBASE: tl.constexpr = True):
    """Everything step t reads, unconverted: x[t] (pair, [BLOCK_M] in the data dtype), the
    raw controls (three scalars) and, PREV, h[t-1] (pair; from row t = 0 itself at t = 0, a
    valid address whose values the caller replaces by h0 or 0).  The pointers as
    :func:`_chunk_base` returns them, indexed by :func:`_dist`.

    FUSED (the SAMU layer fused): forward, x is the layer input [B, L, 2M] (x_i_ptr = x_r_ptr
    + M) and the write is x * gamma ([BLOCK_M] fp32), rounded to x's precision as the unfused
    layer's torch write rounds it; REVERSE, x is d y [B, L, 2M] and d h[t] = d y where the
    saved h[t] (at h_r_ptr, h_i_ptr) > 0 (the relu).  Returned in fp32."""
    d = _dist(t, t0, row, REBASE)
    if FUSED:
        off = d * (2 * M) + lane
    else:
        off = d * M + lane
    xr = tl.load(x_r_ptr + off, mask=mask, other=0.0)
    xi = tl.load(x_i_ptr + off, mask=mask, other=0.0)
    if FUSED:
        if REVERSE:
            # backward: x is d y [B, L, 2M]; through the relu: d h[t] = d y where h[t] > 0
            at = d * M + lane
            htr = tl.load(h_r_ptr + at, mask=mask, other=0.0)
            hti = tl.load(h_i_ptr + at, mask=mask, other=0.0)
            xr = tl.where(htr.to(tl.float32) > 0, xr.to(tl.float32), 0.0)
            xi = tl.where(hti.to(tl.float32) > 0, xi.to(tl.float32), 0.0)
        else:
            xr = round_like(xr.to(tl.float32) * gamma, xr.dtype)
            xi = round_like(xi.to(tl.float32) * gamma, xi.dtype)
    c0, c1, c2 = _controls_at(eta_ptr, delta_ptr, seg_ptr, d, HAS_RESETS, TABLE)
    if PREV:
        prev = _dist(tl.maximum(t - 1, 0), t0, row, REBASE) * M + lane
        hr = tl.load(h_r_ptr + prev, mask=mask, other=0.0)
        hi = tl.load(h_i_ptr + prev, mask=mask, other=0.0)
    else:
        hr = xr
        hi = xi
    return xr, xi, c0, c1, c2, hr, hi


@triton.jit
def _dist(t, t0, row, REBASE: tl.constexpr):
    """Step t's index into the walk's pointers: t - t0 (int32) from the chunk's first step
    where :func:`_chunk_base` rebased them (REBASE), else its token row + t (int64)."""
    if REBASE:
        d = t - t0
    else:
        d = row + t
    return d


@triton.jit
def _base_token(row, t0, REBASE: tl.constexpr):
    """The token the walk's pointers are rebased at (:func:`_chunk_base`): the chunk's first,
    row + t0 (int64), where REBASE; else 0 (the pointers as given, indexed by token)."""
    if REBASE:
        tok0 = row + t0
    else:
        tok0 = 0
    return tok0


@triton.jit
def _rebase_rows(r_ptr, i_ptr, tok0, M, FUSED: tl.constexpr):
    """A pair of row pointers advanced to token ``tok0``: rows of M ([B, L, M]) or, FUSED, of
    the layer's 2M ([B, L, 2M], the imaginary half at + M)."""
    if FUSED:
        stride = 2 * M
    else:
        stride = M
    return r_ptr + tok0 * stride, i_ptr + tok0 * stride


@triton.jit
def _chunk_base(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, h_r_ptr, h_i_ptr, tok0, M,
                HAS_RESETS: tl.constexpr, TABLE: tl.constexpr, FUSED: tl.constexpr,
                HAS_H: tl.constexpr):
    """The walk's pointers rebased at token ``tok0`` (int64: b L + the time of the chunk's
    first step), so that a step indexes them by its int32 distance t - t0 from it
    (:func:`_dist`): one 64-bit product per chunk instead of one per row and pointer.
    Controls: the [B L, 4] control table (TABLE) or eta, delta and (HAS_RESETS) segment
    positions; x: [B, L, M] (FUSED: [B, L, 2M]); h (HAS_H): [B, L, M].  A pointer the walk
    does not use comes back as another one (Triton 3.6 cannot return None in a tuple).
    ``tok0`` = 0 (:func:`_base_token` without REBASE) leaves them as given, indexed by token,
    for the walks whose registers the rebased pointers would raise past an occupancy step
    (see LookbackPlan.rebase)."""
    if TABLE:
        eta_ptr = eta_ptr + tok0 * TABLE_COLS
        delta_ptr = eta_ptr                   # unused
        seg_ptr = eta_ptr                     # unused
    else:
        eta_ptr = eta_ptr + tok0
        delta_ptr = delta_ptr + tok0
        if HAS_RESETS:
            seg_ptr = seg_ptr + tok0
        else:
            seg_ptr = eta_ptr                 # unused
    x_r_ptr, x_i_ptr = _rebase_rows(x_r_ptr, x_i_ptr, tok0, M, FUSED)
    if HAS_H:
        h_r_ptr = h_r_ptr + tok0 * M
        h_i_ptr = h_i_ptr + tok0 * M
    else:
        h_r_ptr = x_r_ptr                     # unused
        h_i_ptr = x_i_ptr
    return eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, h_r_ptr, h_i_ptr


@triton.jit
def _first_map(eta_ptr, delta_ptr, seg_ptr, row, start, L, nu, cos_theta, sin_theta,
               HAS_RESETS: tl.constexpr, TABLE: tl.constexpr):
    """Backward only: A[t + 1] for the chunk's first time t = L - 1 - start (identity when
    t = L - 1).  Returned unconjugated; the walk conjugates it."""
    nxt = tl.minimum(L - start, L - 1)
    ar, ai, _ = _transition_at(eta_ptr, delta_ptr, seg_ptr, row + nxt, nu, cos_theta,
                               sin_theta, HAS_RESETS, TABLE)
    return tl.where(start > 0, ar, 1.0), tl.where(start > 0, ai, 0.0)


@triton.jit
def _summary_step(pr, pi, qr, qi, nr, ni, xr, xi, c0, c1, c2, nu, cos_theta, sin_theta,
                  HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr, TABLE: tl.constexpr):
    """One row of the summary: (P, Q) <- (T P, T Q + x), T = A[t] forward, conj(A[t+1])
    backward ((nr, ni) carries the previous step's A[t+1]; unused forward).  Returns
    (pr, pi, qr, qi, nr, ni), [BLOCK_M] each."""
    ar, ai, _lr = _transition_of(c0, c1, c2, nu, cos_theta, sin_theta, HAS_RESETS, TABLE)
    if REVERSE:
        tr, ti = nr, -ni
        nr, ni = ar, ai
    else:
        tr, ti = ar, ai
    pr, pi = cmul(tr, ti, pr, pi)
    qr, qi = cmul_add(tr, ti, qr, qi, xr.to(tl.float32), xi.to(tl.float32))
    return pr, pi, qr, qi, nr, ni


@triton.jit
def walk_summary(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row, c, L, M, lane, mask, nu,
                 cos_theta, sin_theta, HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, NUM_STAGES: tl.constexpr,
                 TABLE: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                 FUSED: tl.constexpr = False, gamma=None, h_r_ptr=None, h_i_ptr=None,
                 ROWS: tl.constexpr = 1, REBASE: tl.constexpr = True):
    """The chunk's map z -> P z + Q: (Pr, Pi, Qr, Qi), [BLOCK_M] each.

    TABLE: the controls come from the control table at ``eta_ptr`` (:func:`_controls_at`).
    PREFETCH: the next loop step's loads are issued before this step's arithmetic (held in
    registers one step; see the module docstring).  ROWS (1 or 2): rows per loop step, their
    loads issued together (ROWS rows in flight per program; an odd last row is walked after
    the loop).  FUSED, gamma: the SAMU layer fused (:func:`_row_loads`; backward reads the
    relu mask from the saved states at h_r_ptr, h_i_ptr)."""
    start = c * CHUNK
    n = tl.minimum(CHUNK, L - start)
    pr = tl.full((BLOCK_M,), 1.0, tl.float32)
    pi = tl.zeros((BLOCK_M,), tl.float32)
    qr = tl.zeros((BLOCK_M,), tl.float32)
    qi = tl.zeros((BLOCK_M,), tl.float32)
    if REVERSE:
        nr, ni = _first_map(eta_ptr, delta_ptr, seg_ptr, row, start, L, nu, cos_theta,
                            sin_theta, HAS_RESETS, TABLE)
    else:
        nr, ni = pi, pi                 # unused forward (loop-invariant: folded away)
    t0 = _time(start, 0, L, REVERSE)
    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c = _chunk_base(
        eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, h_r_ptr, h_i_ptr,
        _base_token(row, t0, REBASE), M, HAS_RESETS, TABLE, FUSED, FUSED and REVERSE)
    if PREFETCH:
        # the first step's rows (the second clamped into the chunk: in bounds, maybe unused)
        t = t0
        xr_a, xi_a, c0_a, c1_a, c2_a, _hr, _hi = _row_loads(
            eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane, mask,
            HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
        if ROWS == 2:
            t = _time(start, tl.minimum(1, n - 1), L, REVERSE)
            xr_b, xi_b, c0_b, c1_b, c2_b, _hr, _hi = _row_loads(
                eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane, mask,
                HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
    for k in tl.range(0, n // ROWS, num_stages=NUM_STAGES):
        r = k * ROWS
        if PREFETCH:
            xr, xi, c0, c1, c2 = xr_a, xi_a, c0_a, c1_a, c2_a
            # the next step's rows, clamped into the chunk (the last step reloads rows of
            # its own, unused; with ROWS 2 and n odd the first is the odd last row)
            t = _time(start, tl.minimum(r + ROWS, n - 1), L, REVERSE)
            xr_a, xi_a, c0_a, c1_a, c2_a, _hr, _hi = _row_loads(
                eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane, mask,
                HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
            if ROWS == 2:
                xr2, xi2, c02, c12, c22 = xr_b, xi_b, c0_b, c1_b, c2_b
                t = _time(start, tl.minimum(r + 3, n - 1), L, REVERSE)
                xr_b, xi_b, c0_b, c1_b, c2_b, _hr, _hi = _row_loads(
                    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane,
                    mask, HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
        else:
            t = _time(start, r, L, REVERSE)
            xr, xi, c0, c1, c2, _hr, _hi = _row_loads(
                eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane, mask,
                HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
            if ROWS == 2:
                t = _time(start, r + 1, L, REVERSE)
                xr2, xi2, c02, c12, c22, _hr, _hi = _row_loads(
                    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane,
                    mask, HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
        pr, pi, qr, qi, nr, ni = _summary_step(pr, pi, qr, qi, nr, ni, xr, xi, c0, c1, c2, nu,
                                               cos_theta, sin_theta, HAS_RESETS, REVERSE, TABLE)
        if ROWS == 2:
            pr, pi, qr, qi, nr, ni = _summary_step(pr, pi, qr, qi, nr, ni, xr2, xi2, c02, c12,
                                                   c22, nu, cos_theta, sin_theta, HAS_RESETS,
                                                   REVERSE, TABLE)
    if ROWS == 2:
        if n % 2 != 0:
            # the odd last row (prefetched into the first slot)
            if PREFETCH:
                xr, xi, c0, c1, c2 = xr_a, xi_a, c0_a, c1_a, c2_a
            else:
                t = _time(start, n - 1, L, REVERSE)
                xr, xi, c0, c1, c2, _hr, _hi = _row_loads(
                    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane,
                    mask, HAS_RESETS, TABLE, False, FUSED, gamma, REVERSE, REBASE)
            pr, pi, qr, qi, nr, ni = _summary_step(pr, pi, qr, qi, nr, ni, xr, xi, c0, c1, c2,
                                                   nu, cos_theta, sin_theta, HAS_RESETS,
                                                   REVERSE, TABLE)
    return pr, pi, qr, qi


@triton.jit
def _replay_step(sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta, hit, xr, xi,
                 c0, c1, c2, hr, hi, t,
                 d, M, lane, mask, nu, cos_theta, sin_theta, h0r, h0i, gamma, y_r_ptr, y_i_ptr,
                 h_r_ptr, h_i_ptr, g_eta_ptr, g_delta_ptr, n_mblocks, mb, xw_ptr,
                 HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr, ATOMIC: tl.constexpr,
                 TABLE: tl.constexpr, FUSED: tl.constexpr, SAVE_H: tl.constexpr,
                 STAGED: tl.constexpr = False):
    """One row of the replay at time t (``d``: its index into the pointers as
    :func:`_chunk_base` returns them, :func:`_dist`; g_eta_ptr / g_delta_ptr at its token's
    first partial, unused under ATOMIC) from the row's loads (:func:`_row_loads`): the state
    update, its stores and (backward) the row's gradients.  Returns (sr, si, nr, ni, acc_nu,
    acc_delta, acc_gamma), [BLOCK_M] each ((nr, ni): A[t+1] backward, unused forward; h0r, h0i:
    backward's h[-1]), and (tok_eta, tok_delta) [CHUNK]: ATOMIC, the chunk's per-token control
    sums with this row's put at ``hit`` ([CHUNK], its row of the chunk), added atomically once
    after the walk (a scalar atomic per row would wait for its result: Triton broadcasts a
    scalar atomic's return value through a CTA barrier); otherwise the row's sums are stored as
    partials and they pass through.  STAGED (the walk runs under the software pipeliner): the
    plain stores address pointer-first, (y + d M) + lane, an expression the row's load offset d
    M + lane does not share: the pipeliner would otherwise carry that [BLOCK_M] offset from the
    load's stage to the store's, a vector of registers per stage in flight (about 20 registers
    at 4 stages, ptxas sm_90: docs/performance.md)."""
    off = d * M + lane
    ar, ai, log_radius = _transition_of(c0, c1, c2, nu, cos_theta, sin_theta, HAS_RESETS, TABLE)
    if REVERSE:
        # g[t] = conj(A[t+1]) g[t+1] + dout[t]
        sr, si = cmul_conj_add(nr, ni, sr, si, xr.to(tl.float32), xi.to(tl.float32))
        nr, ni = ar, ai
    else:
        # h[t] = A[t] h[t-1] + b[t]
        sr, si = cmul_add(ar, ai, sr, si, xr.to(tl.float32), xi.to(tl.float32))
    if FUSED:
        yoff = d * (2 * M) + lane
        if REVERSE:
            # grad x = g gamma (the write's derivative), d gamma += g . x
            tl.store(y_r_ptr + yoff, (sr * gamma).to(y_r_ptr.dtype.element_ty), mask=mask)
            tl.store(y_i_ptr + yoff, (si * gamma).to(y_i_ptr.dtype.element_ty), mask=mask)
            xwr = tl.load(xw_ptr + yoff, mask=mask, other=0.0).to(tl.float32)
            xwi = tl.load(xw_ptr + M + yoff, mask=mask, other=0.0).to(tl.float32)
            acc_gamma += sr * xwr + si * xwi
        else:
            # relu before the cast (the same value: rounding keeps the sign)
            tl.store(y_r_ptr + yoff, tl.maximum(sr, 0.0).to(y_r_ptr.dtype.element_ty),
                     mask=mask)
            tl.store(y_i_ptr + yoff, tl.maximum(si, 0.0).to(y_i_ptr.dtype.element_ty),
                     mask=mask)
            if SAVE_H:
                tl.store(h_r_ptr + off, sr.to(h_r_ptr.dtype.element_ty), mask=mask)
                tl.store(h_i_ptr + off, si.to(h_i_ptr.dtype.element_ty), mask=mask)
    else:
        if STAGED:
            row_m = d * M
            tl.store((y_r_ptr + row_m) + lane, sr.to(y_r_ptr.dtype.element_ty), mask=mask)
            tl.store((y_i_ptr + row_m) + lane, si.to(y_i_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(y_r_ptr + off, sr.to(y_r_ptr.dtype.element_ty), mask=mask)
            tl.store(y_i_ptr + off, si.to(y_i_ptr.dtype.element_ty), mask=mask)
    if REVERSE:
        # h[t-1] from the saved outputs; h0 or 0 at t = 0
        hr = tl.where(t > 0, hr.to(tl.float32), h0r)
        hi = tl.where(t > 0, hi.to(tl.float32), h0i)
        d_eta, d_delta = transition_gradients(sr, si, hr, hi, ar, ai, log_radius)
        d_eta = tl.where(mask, d_eta, 0.0)
        d_delta = tl.where(mask, d_delta, 0.0)
        # both sums in one reduction: one round of CTA barriers per step, not two
        s_eta, s_delta = tl.reduce((d_eta, d_delta), 0, _add_pair)
        if ATOMIC:
            tok_eta = tl.where(hit, s_eta, tok_eta)
            tok_delta = tl.where(hit, s_delta, tok_delta)
        else:
            tl.store(g_eta_ptr + d * n_mblocks + mb, s_eta)
            tl.store(g_delta_ptr + d * n_mblocks + mb, s_delta)
        acc_nu += d_eta
        acc_delta += d_delta
    return sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta


@triton.jit
def walk_replay(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, y_r_ptr, y_i_ptr, h_r_ptr,
                h_i_ptr, h0_r_ptr, h0_i_ptr, gh0_r_ptr, gh0_i_ptr, g_eta_ptr, g_delta_ptr,
                sr, si, b, row, c, L, M, n_mblocks, mb, lane, mask, nu, cos_theta, sin_theta,
                HAS_RESETS: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr,
                ATOMIC: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                NUM_STAGES: tl.constexpr, TABLE: tl.constexpr = False,
                PREFETCH: tl.constexpr = False, FUSED: tl.constexpr = False, gamma=None,
                SAVE_H: tl.constexpr = False, xw_ptr=None, ROWS: tl.constexpr = 1,
                REBASE: tl.constexpr = True):
    """Walk the chunk from the carry-in (sr, si), storing every state into y.

    Backward also writes per-token control gradients (summed over the tile's modes: stored per
    row as partials, or ATOMIC added once after the walk into [B, L] sums) and grad h0, and
    returns the chunk's per-mode sums (d nu_log, d delta) as [BLOCK_M] each (the caller
    multiplies the latter by theta).  Forward returns zeros.  TABLE, PREFETCH, ROWS: as in
    :func:`walk_summary` (the prefetched loads are issued before the step's stores too, which
    the compiler could not move them above: it cannot tell that y and x do not alias). FUSED,
    gamma: the SAMU layer fused (see :func:`_row_loads`).  Forward: y is the layer output [B, L,
    2M] (y_i_ptr = y_r_ptr + M) receiving relu of the state rounded to y's dtype, and SAVE_H
    also stores the states into h (training).  Backward: y is grad x [B, L, 2M] receiving g *
    gamma, and the per-mode sum of g . x (x at ``xw_ptr``, the layer input) is returned third: d
    gamma (zeros otherwise).
    """
    start = c * CHUNK
    n = tl.minimum(CHUNK, L - start)
    acc_nu = tl.zeros((BLOCK_M,), tl.float32)
    acc_delta = tl.zeros((BLOCK_M,), tl.float32)
    acc_gamma = tl.zeros((BLOCK_M,), tl.float32)
    rows = tl.arange(0, CHUNK)                                                   # [CHUNK]
    tok_eta = tl.zeros((CHUNK,), tl.float32)
    tok_delta = tl.zeros((CHUNK,), tl.float32)
    if REVERSE:
        nr, ni = _first_map(eta_ptr, delta_ptr, seg_ptr, row, start, L, nu, cos_theta,
                            sin_theta, HAS_RESETS, TABLE)
        state = b * M + lane
        if HAS_H0:
            h0r = tl.load(h0_r_ptr + state, mask=mask, other=0.0).to(tl.float32)
            h0i = tl.load(h0_i_ptr + state, mask=mask, other=0.0).to(tl.float32)
        else:
            h0r = tl.zeros((BLOCK_M,), tl.float32)
            h0i = tl.zeros((BLOCK_M,), tl.float32)
    else:
        # unused forward (loop-invariant: folded away)
        nr, ni, h0r, h0i = acc_nu, acc_nu, acc_nu, acc_nu
    t0 = _time(start, 0, L, REVERSE)
    tok0 = _base_token(row, t0, REBASE)
    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c = _chunk_base(
        eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, h_r_ptr, h_i_ptr, tok0, M, HAS_RESETS,
        TABLE, FUSED, REVERSE or SAVE_H)
    y_r_c, y_i_c = _rebase_rows(y_r_ptr, y_i_ptr, tok0, M, FUSED)
    if REVERSE:
        if ATOMIC:
            g_eta_c = g_eta_ptr + tok0
            g_delta_c = g_delta_ptr + tok0
        else:
            g_eta_c = g_eta_ptr + tok0 * n_mblocks
            g_delta_c = g_delta_ptr + tok0 * n_mblocks
        if FUSED:
            xw_c = xw_ptr + tok0 * (2 * M)
        else:
            xw_c = xw_ptr
    else:
        g_eta_c, g_delta_c, xw_c = g_eta_ptr, g_delta_ptr, xw_ptr
    if PREFETCH:
        # the first step's rows (the second clamped into the chunk: in bounds, maybe unused)
        ta = t0
        xr_a, xi_a, c0_a, c1_a, c2_a, hr_a, hi_a = _row_loads(
            eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, ta, t0, row, M, lane, mask,
            HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
        if ROWS == 2:
            ta = _time(start, tl.minimum(1, n - 1), L, REVERSE)
            xr_b, xi_b, c0_b, c1_b, c2_b, hr_b, hi_b = _row_loads(
                eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, ta, t0, row, M, lane, mask,
                HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
    for k in tl.range(0, n // ROWS, num_stages=NUM_STAGES):
        r = k * ROWS
        t = _time(start, r, L, REVERSE)
        if PREFETCH:
            xr, xi, c0, c1, c2, hr, hi = xr_a, xi_a, c0_a, c1_a, c2_a, hr_a, hi_a
            # the next step's rows, clamped into the chunk (see walk_summary)
            ta = _time(start, tl.minimum(r + ROWS, n - 1), L, REVERSE)
            xr_a, xi_a, c0_a, c1_a, c2_a, hr_a, hi_a = _row_loads(
                eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, ta, t0, row, M, lane, mask,
                HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
            if ROWS == 2:
                xr2, xi2, c02, c12, c22, hr2, hi2 = xr_b, xi_b, c0_b, c1_b, c2_b, hr_b, hi_b
                ta = _time(start, tl.minimum(r + 3, n - 1), L, REVERSE)
                xr_b, xi_b, c0_b, c1_b, c2_b, hr_b, hi_b = _row_loads(
                    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, ta, t0, row, M, lane, mask,
                    HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
        else:
            xr, xi, c0, c1, c2, hr, hi = _row_loads(
                eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane, mask,
                HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
            if ROWS == 2:
                ta = _time(start, r + 1, L, REVERSE)
                xr2, xi2, c02, c12, c22, hr2, hi2 = _row_loads(
                    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, ta, t0, row, M, lane, mask,
                    HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
        sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta = _replay_step(
            sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta, rows == r, xr, xi,
            c0, c1, c2, hr, hi, t,
            _dist(t, t0, row, REBASE),
            M, lane, mask, nu, cos_theta, sin_theta, h0r, h0i, gamma, y_r_c, y_i_c, h_r_c, h_i_c,
            g_eta_c, g_delta_c, n_mblocks, mb, xw_c, HAS_RESETS, REVERSE, ATOMIC, TABLE, FUSED,
            SAVE_H, NUM_STAGES > 1)
        if ROWS == 2:
            t2 = _time(start, r + 1, L, REVERSE)
            sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta = _replay_step(
                sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta, rows == r + 1,
                xr2, xi2, c02, c12, c22, hr2, hi2,
                t2, _dist(t2, t0, row, REBASE), M, lane, mask, nu, cos_theta, sin_theta, h0r,
                h0i, gamma, y_r_c, y_i_c, h_r_c, h_i_c, g_eta_c, g_delta_c, n_mblocks, mb, xw_c,
                HAS_RESETS, REVERSE, ATOMIC, TABLE, FUSED, SAVE_H,
                NUM_STAGES > 1)
    if ROWS == 2:
        if n % 2 != 0:
            # the odd last row (prefetched into the first slot)
            t = _time(start, n - 1, L, REVERSE)
            if PREFETCH:
                xr, xi, c0, c1, c2, hr, hi = xr_a, xi_a, c0_a, c1_a, c2_a, hr_a, hi_a
            else:
                xr, xi, c0, c1, c2, hr, hi = _row_loads(
                    eta_c, delta_c, seg_c, x_r_c, x_i_c, h_r_c, h_i_c, t, t0, row, M, lane, mask,
                    HAS_RESETS, TABLE, REVERSE, FUSED, gamma, REVERSE, REBASE)
            sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta = _replay_step(
                sr, si, nr, ni, acc_nu, acc_delta, acc_gamma, tok_eta, tok_delta, rows == n - 1,
                xr, xi, c0, c1, c2, hr, hi, t,
                _dist(t, t0, row, REBASE), M, lane, mask, nu, cos_theta, sin_theta, h0r, h0i,
                gamma, y_r_c, y_i_c, h_r_c, h_i_c, g_eta_c, g_delta_c, n_mblocks, mb, xw_c,
                HAS_RESETS, REVERSE, ATOMIC, TABLE, FUSED, SAVE_H,
                NUM_STAGES > 1)
    if REVERSE:
        if ATOMIC:
            # the chunk's per-token control sums, one vector atomic each
            d_rows = _dist(_time(start, rows, L, REVERSE), t0, row, REBASE)        # [CHUNK]
            tl.atomic_add(g_eta_c + d_rows, tok_eta, mask=rows < n)
            tl.atomic_add(g_delta_c + d_rows, tok_delta, mask=rows < n)
        if HAS_H0:
            if start + n == L:
                # the chunk ends at t = 0: grad h0 = conj(A[0]) g[0]
                g0r, g0i = cmul_conj(nr, ni, sr, si)
                tl.store(gh0_r_ptr + state, g0r, mask=mask)
                tl.store(gh0_i_ptr + state, g0i, mask=mask)
    return acc_nu, acc_delta, acc_gamma
