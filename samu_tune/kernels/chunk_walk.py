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
"""
import triton
import triton.language as tl

from .complex_math import cmul, cmul_conj, transition, transition_cs
from .controls import TABLE_COLS
from .tile import transition_gradients


@triton.jit
def _transition_at(eta_ptr, delta_ptr, seg_ptr, tok, nu, cos_theta, sin_theta,
                   HAS_RESETS: tl.constexpr, TABLE: tl.constexpr):
    """A at token ``tok`` (= b L + t) for a mode tile: (ar, ai, log_radius), [BLOCK_M] each;
    A = 0 where a reset starts a sequence.  TABLE: ``eta_ptr`` is the [B L, 4] control table
    (:mod:`samu_tune.kernels.controls`, resets already applied; delta_ptr, seg_ptr unused)."""
    if TABLE:
        row = eta_ptr + tok * TABLE_COLS
        return transition_cs(nu, cos_theta, sin_theta, tl.load(row), tl.load(row + 1),
                             tl.load(row + 2))
    eta = tl.load(eta_ptr + tok).to(tl.float32)
    delta = tl.load(delta_ptr + tok).to(tl.float32)
    ar, ai, log_radius = transition(nu, cos_theta, sin_theta, eta, delta)
    if HAS_RESETS:
        keep = tl.load(seg_ptr + tok) != 0
        ar = tl.where(keep, ar, 0.0)
        ai = tl.where(keep, ai, 0.0)
    return ar, ai, log_radius


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
def walk_summary(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row, c, L, M, lane, mask, nu,
                 cos_theta, sin_theta, HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, NUM_STAGES: tl.constexpr,
                 TABLE: tl.constexpr = False):
    """The chunk's map z -> P z + Q: (Pr, Pi, Qr, Qi), [BLOCK_M] each.  TABLE: the controls
    come from the control table at ``eta_ptr`` (see :func:`_transition_at`)."""
    start = c * CHUNK
    n = tl.minimum(CHUNK, L - start)
    pr = tl.full((BLOCK_M,), 1.0, tl.float32)
    pi = tl.zeros((BLOCK_M,), tl.float32)
    qr = tl.zeros((BLOCK_M,), tl.float32)
    qi = tl.zeros((BLOCK_M,), tl.float32)
    if REVERSE:
        nr, ni = _first_map(eta_ptr, delta_ptr, seg_ptr, row, start, L, nu, cos_theta,
                            sin_theta, HAS_RESETS, TABLE)
    for r in tl.range(0, n, num_stages=NUM_STAGES):
        if REVERSE:
            t = L - 1 - (start + r)
        else:
            t = start + r
        tok = row + t
        xr = tl.load(x_r_ptr + tok * M + lane, mask=mask, other=0.0).to(tl.float32)
        xi = tl.load(x_i_ptr + tok * M + lane, mask=mask, other=0.0).to(tl.float32)
        ar, ai, _ = _transition_at(eta_ptr, delta_ptr, seg_ptr, tok, nu, cos_theta, sin_theta,
                                   HAS_RESETS, TABLE)
        if REVERSE:
            tr, ti = nr, -ni
            nr, ni = ar, ai
        else:
            tr, ti = ar, ai
        pr, pi = cmul(tr, ti, pr, pi)
        qr, qi = cmul(tr, ti, qr, qi)
        qr += xr
        qi += xi
    return pr, pi, qr, qi


@triton.jit
def walk_replay(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, y_r_ptr, y_i_ptr, h_r_ptr,
                h_i_ptr, h0_r_ptr, h0_i_ptr, gh0_r_ptr, gh0_i_ptr, g_eta_ptr, g_delta_ptr,
                sr, si, b, row, c, L, M, n_mblocks, mb, lane, mask, nu, cos_theta, sin_theta,
                HAS_RESETS: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr,
                ATOMIC: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                NUM_STAGES: tl.constexpr, TABLE: tl.constexpr = False):
    """Walk the chunk from the carry-in (sr, si), storing every state into y.

    Backward also stores per-token control gradients (summed over the tile's modes) and grad
    h0, and returns the chunk's per-mode sums (d nu_log, d delta) as [BLOCK_M] each (the caller
    multiplies the latter by theta).  Forward returns zeros.  TABLE: as in :func:`walk_summary`.
    """
    start = c * CHUNK
    n = tl.minimum(CHUNK, L - start)
    acc_nu = tl.zeros((BLOCK_M,), tl.float32)
    acc_delta = tl.zeros((BLOCK_M,), tl.float32)
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
    for r in tl.range(0, n, num_stages=NUM_STAGES):
        if REVERSE:
            t = L - 1 - (start + r)
        else:
            t = start + r
        tok = row + t
        off = tok * M + lane
        xr = tl.load(x_r_ptr + off, mask=mask, other=0.0).to(tl.float32)
        xi = tl.load(x_i_ptr + off, mask=mask, other=0.0).to(tl.float32)
        ar, ai, log_radius = _transition_at(eta_ptr, delta_ptr, seg_ptr, tok, nu, cos_theta,
                                            sin_theta, HAS_RESETS, TABLE)
        if REVERSE:
            sr, si = cmul_conj(nr, ni, sr, si)          # g[t] = conj(A[t+1]) g[t+1] + dout[t]
            nr, ni = ar, ai
        else:
            sr, si = cmul(ar, ai, sr, si)               # h[t] = A[t] h[t-1] + b[t]
        sr += xr
        si += xi
        tl.store(y_r_ptr + off, sr.to(y_r_ptr.dtype.element_ty), mask=mask)
        tl.store(y_i_ptr + off, si.to(y_i_ptr.dtype.element_ty), mask=mask)
        if REVERSE:
            # h[t-1] from the saved outputs (a valid address even at t = 0, where h0 or 0 is used)
            prev = (row + tl.maximum(t - 1, 0)) * M + lane
            hr = tl.load(h_r_ptr + prev, mask=mask, other=0.0).to(tl.float32)
            hi = tl.load(h_i_ptr + prev, mask=mask, other=0.0).to(tl.float32)
            hr = tl.where(t > 0, hr, h0r)
            hi = tl.where(t > 0, hi, h0i)
            d_eta, d_delta = transition_gradients(sr, si, hr, hi, ar, ai, log_radius)
            d_eta = tl.where(mask, d_eta, 0.0)
            d_delta = tl.where(mask, d_delta, 0.0)
            if ATOMIC:
                tl.atomic_add(g_eta_ptr + tok, tl.sum(d_eta, axis=0))
                tl.atomic_add(g_delta_ptr + tok, tl.sum(d_delta, axis=0))
            else:
                tl.store(g_eta_ptr + tok * n_mblocks + mb, tl.sum(d_eta, axis=0))
                tl.store(g_delta_ptr + tok * n_mblocks + mb, tl.sum(d_delta, axis=0))
            acc_nu += d_eta
            acc_delta += d_delta
    if REVERSE:
        if HAS_H0:
            if start + n == L:
                # the chunk ends at t = 0: grad h0 = conj(A[0]) g[0]
                g0r, g0i = cmul_conj(nr, ni, sr, si)
                tl.store(gh0_r_ptr + state, g0r, mask=mask)
                tl.store(gh0_i_ptr + state, g0i, mask=mask)
    return acc_nu, acc_delta
