"""Chunk summary and chunk replay: the parallel stages of the chunk family.

The sequence of row b is cut into chunks of CHUNK steps (in scan order: time order forward,
reversed time order backward; see :mod:`samu_tune.kernels.tile`).  Each program owns one
(row b, chunk c, mode tile) as a [CHUNK, BLOCK_M] tile and scans it with
``tl.associative_scan``; row r of the scanned tile is the affine map z -> P[r] z + Q[r] from
the state entering the chunk to the state after row r.  With ``WALK`` the program instead
walks the chunk's steps on a [BLOCK_M] vector (:mod:`samu_tune.kernels.chunk_walk`); the
stores are the same.

- :func:`chunk_summary` stores the whole chunk's map (the last row, P, Q) into
  [B, n_chunks, M] fp32 buffers; a prefix (:mod:`samu_tune.kernels.prefix`) turns those into
  each chunk's carry-in.
- :func:`chunk_replay` re-scans the tile and applies it to the carry-in: every row's state
  ``P carry + Q``.  Forward that is the output h[t]; backward (REVERSE) it is the adjoint
  g[t] = dout[t] + conj(A[t+1]) g[t+1], which is grad br + i grad bi, and from it and the
  saved forward outputs (h[t-1]; h0 or 0 at t = 0) the transition gradients.

B, L, M and the chunk and tile counts are runtime values: one binary per block-size choice.
"""
import triton
import triton.language as tl

from samu_tune.kernels.chunk_walk import walk_replay, walk_summary
from samu_tune.kernels.complex_math import cmul, cmul_conj, spectrum
from samu_tune.kernels.tile import load_transition, scan_transition, tile_scan, tile_times, transition_gradients


@triton.jit
def _program(n_chunks, n_mblocks):
    """Program id -> (b (int64), c, mb, b * n_chunks + c (int64)).

    Grid: (B * n_chunks * n_mblocks,) on axis 0 (no 65535 limit); neighbouring programs hold
    neighbouring mode tiles of the same chunk.
    """
    pid = tl.program_id(0)
    mb = pid % n_mblocks
    bc = pid // n_mblocks
    return (bc // n_chunks).to(tl.int64), bc % n_chunks, mb, bc.to(tl.int64)


@triton.jit
def _scanned_tile(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row, c, L, M, lane, mask,
                  nu, cos_theta, sin_theta, HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr,
                  CHUNK: tl.constexpr):
    """The scanned maps of chunk c: (Pr, Pi, Qr, Qi, t, valid, valid2, offs).

    P, Q, valid2, offs: [CHUNK, BLOCK_M]; t, valid: [CHUNK].  ``row`` = b L (int64).  The
    transition at row r is A[t] forward, conj(A[t+1]) backward; padding rows are identity.
    """
    t, valid = tile_times(c * CHUNK, L, CHUNK, REVERSE)
    ar, ai = scan_transition(eta_ptr, delta_ptr, seg_ptr, row, t, valid, L, nu, cos_theta,
                             sin_theta, HAS_RESETS, REVERSE)           # [CHUNK, BLOCK_M]
    valid2 = valid[:, None] & mask[None, :]
    offs = (row + t)[:, None] * M + lane[None, :]
    ur = tl.load(x_r_ptr + offs, mask=valid2, other=0.0).to(tl.float32)
    ui = tl.load(x_i_ptr + offs, mask=valid2, other=0.0).to(tl.float32)
    pr, pi, qr, qi = tile_scan(ar, ai, ur, ui)
    return pr, pi, qr, qi, t, valid, valid2, offs


@triton.jit(do_not_specialize=["L", "M", "n_chunks", "n_mblocks"])
def chunk_summary(
    eta_ptr, delta_ptr,          # [B, L] controls
    nu_log_ptr, theta_log_ptr,   # [M] spectrum
    seg_ptr,                     # [B, L] int segment positions (HAS_RESETS)
    x_r_ptr, x_i_ptr,            # fwd: br, bi   rev: d out    [B, L, M]
    p_r_ptr, p_i_ptr,            # chunk map P (written)  [B, n_chunks, M] f32
    q_r_ptr, q_i_ptr,            # chunk map Q (written)  [B, n_chunks, M] f32
    L, M, n_chunks, n_mblocks,
    HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr, WALK: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """The map z -> P z + Q of one (row, chunk, mode tile): the chunk's state from its carry-in.

    WALK: by a rolled walk over the chunk's steps (:mod:`samu_tune.kernels.chunk_walk`),
    else by an associative scan of the [CHUNK, BLOCK_M] tile.
    """
    b, c, mb, bc = _program(n_chunks, n_mblocks)
    lane = mb * BLOCK_M + tl.arange(0, BLOCK_M)                                      # [BLOCK_M]
    mask = lane < M
    nu, _, cos_theta, sin_theta = spectrum(nu_log_ptr, theta_log_ptr, lane, mask)
    if WALK:
        pr, pi, qr, qi = walk_summary(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, b * L, c,
                                      L, M, lane, mask, nu, cos_theta, sin_theta, HAS_RESETS,
                                      REVERSE, CHUNK, BLOCK_M, NUM_STAGES)        # [BLOCK_M]
        soff = bc * M + lane
        tl.store(p_r_ptr + soff, pr, mask=mask)
        tl.store(p_i_ptr + soff, pi, mask=mask)
        tl.store(q_r_ptr + soff, qr, mask=mask)
        tl.store(q_i_ptr + soff, qi, mask=mask)
    else:
        pr, pi, qr, qi, _, _, _, _ = _scanned_tile(
            eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, b * L, c, L, M, lane, mask, nu,
            cos_theta, sin_theta, HAS_RESETS, REVERSE, CHUNK)
        # the last row is the whole chunk (padding rows are identity); a masked 2-D store of
        # that row avoids a cross-warp reduction
        last = (tl.arange(0, CHUNK) == CHUNK - 1)[:, None] & mask[None, :]  # [CHUNK, BLOCK_M]
        soff = tl.zeros([CHUNK, 1], tl.int64) + (bc * M + lane)[None, :]
        tl.store(p_r_ptr + soff, pr, mask=last)
        tl.store(p_i_ptr + soff, pi, mask=last)
        tl.store(q_r_ptr + soff, qr, mask=last)
        tl.store(q_i_ptr + soff, qi, mask=last)


@triton.jit
def _tile_replay(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, y_r_ptr, y_i_ptr, h_r_ptr,
                 h_i_ptr, h0_r_ptr, h0_i_ptr, gh0_r_ptr, gh0_i_ptr, g_eta_ptr, g_delta_ptr,
                 cr, ci, b, row, c, L, M, n_mblocks, mb, lane, mask, nu, cos_theta, sin_theta,
                 HAS_RESETS: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr,
                 ATOMIC: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr):
    """:func:`chunk_replay` by re-scanning the [CHUNK, BLOCK_M] tile: every state is
    P carry + Q.  Same stores as :func:`~samu_tune.kernels.chunk_walk.walk_replay`, and its
    first two returns."""
    pr, pi, qr, qi, t, valid, valid2, offs = _scanned_tile(
        eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row, c, L, M, lane, mask, nu,
        cos_theta, sin_theta, HAS_RESETS, REVERSE, CHUNK)
    sr, si = cmul(pr, pi, cr[None, :], ci[None, :])                    # [CHUNK, BLOCK_M]
    sr += qr
    si += qi
    tl.store(y_r_ptr + offs, sr.to(y_r_ptr.dtype.element_ty), mask=valid2)
    tl.store(y_i_ptr + offs, si.to(y_i_ptr.dtype.element_ty), mask=valid2)
    mode_nu = tl.zeros((BLOCK_M,), tl.float32)
    mode_delta = tl.zeros((BLOCK_M,), tl.float32)
    if REVERSE:
        # sr, si is the adjoint g[t]; the transition A[t] itself (not the scan's conj(A[t+1]))
        ar, ai, log_radius, _ = load_transition(eta_ptr, delta_ptr, seg_ptr, row, t, valid, nu,
                                                cos_theta, sin_theta, HAS_RESETS)
        has_prev = (valid & (t > 0))[:, None] & mask[None, :]
        prev = offs - M                                   # h[t-1]; masked at t = 0
        hr = tl.load(h_r_ptr + prev, mask=has_prev, other=0.0).to(tl.float32)
        hi = tl.load(h_i_ptr + prev, mask=has_prev, other=0.0).to(tl.float32)
        if HAS_H0:
            first = (t == 0)[:, None] & mask[None, :]                  # [CHUNK, BLOCK_M]
            state = tl.zeros([CHUNK, 1], tl.int64) + (b * M + lane)[None, :]
            h0r = tl.load(h0_r_ptr + b * M + lane, mask=mask, other=0.0).to(tl.float32)
            h0i = tl.load(h0_i_ptr + b * M + lane, mask=mask, other=0.0).to(tl.float32)
            hr = tl.where(first, h0r[None, :], hr)
            hi = tl.where(first, h0i[None, :], hi)
            # grad h0 = conj(A[0]) g[0]: only the program holding t = 0 writes it
            g0r, g0i = cmul_conj(ar, ai, sr, si)
            tl.store(gh0_r_ptr + state, g0r, mask=first)
            tl.store(gh0_i_ptr + state, g0i, mask=first)
        d_eta, d_delta = transition_gradients(sr, si, hr, hi, ar, ai, log_radius)
        d_eta = tl.where(valid2, d_eta, 0.0)
        d_delta = tl.where(valid2, d_delta, 0.0)
        tok_eta = tl.sum(d_eta, axis=1)                                              # [CHUNK]
        tok_delta = tl.sum(d_delta, axis=1)
        if ATOMIC:
            tl.atomic_add(g_eta_ptr + row + t, tok_eta, mask=valid)
            tl.atomic_add(g_delta_ptr + row + t, tok_delta, mask=valid)
        else:
            tok = (row + t) * n_mblocks + mb
            tl.store(g_eta_ptr + tok, tok_eta, mask=valid)
            tl.store(g_delta_ptr + tok, tok_delta, mask=valid)
        mode_nu = tl.sum(d_eta, axis=0)
        mode_delta = tl.sum(d_delta, axis=0)
    return mode_nu, mode_delta


@triton.jit(do_not_specialize=["L", "M", "n_chunks", "n_mblocks"])
def chunk_replay(
    eta_ptr, delta_ptr,          # [B, L] controls
    nu_log_ptr, theta_log_ptr,   # [M] spectrum
    seg_ptr,                     # [B, L] int segment positions (HAS_RESETS)
    x_r_ptr, x_i_ptr,            # fwd: br, bi   rev: d out    [B, L, M]
    carry_r_ptr, carry_i_ptr,    # state entering each chunk  [B, n_chunks, M] f32
    y_r_ptr, y_i_ptr,            # fwd: out (written)   rev: grad br, bi (written)  [B, L, M]
    h_r_ptr, h_i_ptr,            # rev: saved forward out, read as h[t-1]  [B, L, M]
    h0_r_ptr, h0_i_ptr,          # rev: initial state (HAS_H0)  [B, M]
    gh0_r_ptr, gh0_i_ptr,        # rev: grad h0 (written, HAS_H0)  [B, M] f32
    g_eta_ptr, g_delta_ptr,      # rev: grad eta, delta  [B, L, n_mblocks] (ATOMIC: [B, L]) f32
    g_nu_ptr, g_theta_ptr,       # rev: grad nu_log, theta_log  [B, n_chunks, M] (ATOMIC: [M]) f32
    L, M, n_chunks, n_mblocks,
    HAS_RESETS: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr,
    ATOMIC: tl.constexpr, WALK: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Every state of one (row, chunk, mode tile) from its carry-in; backward also the gradients.

    Backward, per element: dL/dA[t] = g[t] conj(h[t-1]) gives d eta, d delta
    (:func:`transition_gradients`), zero where a reset zeroes A[t]; grad h0 = conj(A[0]) g[0].
    Control gradients are summed over the tile's modes, spectrum gradients over the chunk's
    steps: stored as partials (deterministic) or float-atomically added (ATOMIC).  WALK picks
    the rolled walk (pipelined NUM_STAGES deep) over the tile scan.
    """
    b, c, mb, bc = _program(n_chunks, n_mblocks)
    lane = mb * BLOCK_M + tl.arange(0, BLOCK_M)                                      # [BLOCK_M]
    mask = lane < M
    nu, theta, cos_theta, sin_theta = spectrum(nu_log_ptr, theta_log_ptr, lane, mask)
    row = b * L
    cr = tl.load(carry_r_ptr + bc * M + lane, mask=mask, other=0.0)                  # [BLOCK_M]
    ci = tl.load(carry_i_ptr + bc * M + lane, mask=mask, other=0.0)
    if WALK:
        mode_nu, mode_delta, _ = walk_replay(
            eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, y_r_ptr, y_i_ptr, h_r_ptr, h_i_ptr,
            h0_r_ptr, h0_i_ptr, gh0_r_ptr, gh0_i_ptr, g_eta_ptr, g_delta_ptr, cr, ci, b, row,
            c, L, M, n_mblocks, mb, lane, mask, nu, cos_theta, sin_theta, HAS_RESETS, HAS_H0,
            REVERSE, ATOMIC, CHUNK, BLOCK_M, NUM_STAGES)
    else:
        mode_nu, mode_delta = _tile_replay(
            eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, y_r_ptr, y_i_ptr, h_r_ptr, h_i_ptr,
            h0_r_ptr, h0_i_ptr, gh0_r_ptr, gh0_i_ptr, g_eta_ptr, g_delta_ptr, cr, ci, b, row,
            c, L, M, n_mblocks, mb, lane, mask, nu, cos_theta, sin_theta, HAS_RESETS, HAS_H0,
            REVERSE, ATOMIC, CHUNK, BLOCK_M)
    if REVERSE:
        # d log_radius / d nu_log = log_radius (already in d eta); d theta / d theta_log = theta
        mode_theta = mode_delta * theta
        if ATOMIC:
            tl.atomic_add(g_nu_ptr + lane, mode_nu, mask=mask)
            tl.atomic_add(g_theta_ptr + lane, mode_theta, mask=mask)
        else:
            tl.store(g_nu_ptr + bc * M + lane, mode_nu, mask=mask)
            tl.store(g_theta_ptr + bc * M + lane, mode_theta, mask=mask)
