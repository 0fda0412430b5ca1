"""The serial scan: state in registers, one program per (batch row, mode tile), walk L.

Forward (REVERSE=False), for t = 0 .. L-1::

    h[t] = A[t] h[t-1] + (br[t] + i bi[t]),   h[-1] = h0 or 0,   out[t] = h[t]

Backward (REVERSE=True), the adjoint walked for t = L-1 .. 0 from the final-state gradient::

    g[t]   = dout[t] + conj(A[t+1]) g[t+1],   g[L-1] = dout[L-1] + d final
    grad b[t] = g[t];  dL/dA[t] = g[t] conj(h[t-1])  (h[t-1] read back from the saved outputs,
    h0 or 0 at t = 0);  grad h0 = conj(A[0]) g[0]  (zero where a reset zeroes A[0])

Every input is read once per direction.  Per-token control gradients (eta, delta) are summed
over the program's modes and written as partials [B, L, n_mblocks]; per-mode spectrum
gradients (nu_log, theta_log) are summed over time and written as partials [B, M]; the caller
reduces both with torch (deterministic, no atomics).

B, L, M and the tile count are runtime values (not specialised), so one binary serves every
shape; only block sizes and feature flags are compile-time.
"""
import triton
import triton.language as tl

from samu_tune.kernels.complex_math import cmul, cmul_conj, load_pair, polar
from samu_tune.kernels.tile import transition_gradients


@triton.jit
def _step_transition(eta_ptr, delta_ptr, seg_ptr, rho_ptr, tok, lane_off, mask, nu, cos_theta,
                     sin_theta, HAS_RESETS: tl.constexpr, PRECOMPUTED: tl.constexpr):
    """A[t] of one token for a mode tile: (ar, ai, log_radius), each [BLOCK_M].

    ``tok`` = b L + t (int64); ``lane_off`` = tok M + lane.  With PRECOMPUTED the radius
    exp(-nu e^eta) is read from ``rho`` [B, L, M] fp32 instead of evaluated; log_radius (for
    the backward pass) is always the cheap -nu e^eta (one exp per token).
    """
    eta = tl.load(eta_ptr + tok).to(tl.float32)
    delta = tl.load(delta_ptr + tok).to(tl.float32)
    log_radius = -nu * tl.exp(eta)                                               # [BLOCK_M]
    if PRECOMPUTED:
        radius = tl.load(rho_ptr + lane_off, mask=mask, other=0.0)
    else:
        radius = tl.exp(log_radius)
    if HAS_RESETS:
        # a sequence starts at t: A[t] = 0 cuts the state (and every gradient through A[t])
        radius = tl.where(tl.load(seg_ptr + tok) != 0, radius, 0.0)
    ar, ai = polar(radius, cos_theta, sin_theta, delta)
    return ar, ai, log_radius


@triton.jit(do_not_specialize=["L", "M", "n_mblocks"])
def serial_scan(
    eta_ptr, delta_ptr,          # [B, L] controls (f32 / bf16)
    nu_log_ptr, theta_log_ptr,   # [M] spectrum (f32)
    seg_ptr,                     # [B, L] int segment positions (HAS_RESETS)
    rho_ptr,                     # [B, L, M] f32 precomputed radius (PRECOMPUTED)
    x_r_ptr, x_i_ptr,            # fwd: br, bi          rev: d out        [B, L, M]
    h0_r_ptr, h0_i_ptr,          # [B, M] initial state (HAS_H0)
    y_r_ptr, y_i_ptr,            # fwd: out (written)   rev: out (read as h[t-1])  [B, L, M]
    end_r_ptr, end_i_ptr,        # fwd: final state (written)  rev: its gradient (read)  [B, M] f32
    gx_r_ptr, gx_i_ptr,          # rev: grad br, bi (written)  [B, L, M]
    gh0_r_ptr, gh0_i_ptr,        # rev: grad h0 (written, HAS_H0)  [B, M] f32
    p_eta_ptr, p_delta_ptr,      # rev: partial grad eta, delta  [B, L, n_mblocks] f32
    p_nu_ptr, p_theta_ptr,       # rev: partial grad nu_log, theta_log  [B, M] f32
    L, M, n_mblocks,
    HAS_RESETS: tl.constexpr, HAS_H0: tl.constexpr, PRECOMPUTED: tl.constexpr,
    REVERSE: tl.constexpr, BLOCK_M: tl.constexpr, NUM_STAGES: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """One program walks all L steps of row b for modes [mb BLOCK_M, (mb + 1) BLOCK_M).

    Grid: (B * n_mblocks,), program id = b * n_mblocks + mb (neighbouring programs touch
    neighbouring modes of the same token).
    """
    pid = tl.program_id(0)
    mb = pid % n_mblocks
    b = (pid // n_mblocks).to(tl.int64)
    lane = mb * BLOCK_M + tl.arange(0, BLOCK_M)                                  # [BLOCK_M]
    mask = lane < M
    nu = tl.exp(tl.load(nu_log_ptr + lane, mask=mask, other=0.0).to(tl.float32))
    theta = tl.exp(tl.load(theta_log_ptr + lane, mask=mask, other=0.0).to(tl.float32))
    cos_theta, sin_theta = tl.cos(theta), tl.sin(theta)
    row = b * L                                       # int64: B L M may exceed 2^31
    state_off = b * M + lane                          # [BLOCK_M] into [B, M] buffers

    if REVERSE:
        # carry = conj(A[t+1]) g[t+1]; before the walk it is the final-state gradient
        cr = tl.load(end_r_ptr + state_off, mask=mask, other=0.0).to(tl.float32)
        ci = tl.load(end_i_ptr + state_off, mask=mask, other=0.0).to(tl.float32)
        h0r, h0i = load_pair(h0_r_ptr, h0_i_ptr, state_off, mask, HAS_H0, BLOCK_M)
        acc_nu = tl.zeros((BLOCK_M,), tl.float32)
        acc_theta = tl.zeros((BLOCK_M,), tl.float32)
        for i in tl.range(0, L, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
            t = L - 1 - i
            tok = row + t
            off = tok * M + lane
            gr = cr + tl.load(x_r_ptr + off, mask=mask, other=0.0).to(tl.float32)
            gi = ci + tl.load(x_i_ptr + off, mask=mask, other=0.0).to(tl.float32)
            tl.store(gx_r_ptr + off, gr.to(gx_r_ptr.dtype.element_ty), mask=mask)
            tl.store(gx_i_ptr + off, gi.to(gx_i_ptr.dtype.element_ty), mask=mask)
            # h[t-1]: the saved output one step back (a valid address even at t = 0, where
            # h0 or 0 is used instead)
            prev = (row + tl.maximum(t - 1, 0)) * M + lane
            hr = tl.load(y_r_ptr + prev, mask=mask, other=0.0).to(tl.float32)
            hi = tl.load(y_i_ptr + prev, mask=mask, other=0.0).to(tl.float32)
            hr = tl.where(t > 0, hr, h0r)
            hi = tl.where(t > 0, hi, h0i)
            ar, ai, log_radius = _step_transition(
                eta_ptr, delta_ptr, seg_ptr, rho_ptr, tok, off, mask, nu, cos_theta,
                sin_theta, HAS_RESETS, PRECOMPUTED)
            d_eta, d_delta = transition_gradients(gr, gi, hr, hi, ar, ai, log_radius)
            d_eta = tl.where(mask, d_eta, 0.0)
            d_delta = tl.where(mask, d_delta, 0.0)
            tl.store(p_eta_ptr + tok * n_mblocks + mb, tl.sum(d_eta, axis=0))
            tl.store(p_delta_ptr + tok * n_mblocks + mb, tl.sum(d_delta, axis=0))
            acc_nu += d_eta           # d log_radius / d nu_log = log_radius
            acc_theta += d_delta      # times theta below: d theta / d theta_log = theta
            cr, ci = cmul_conj(ar, ai, gr, gi)
        tl.store(p_nu_ptr + state_off, acc_nu, mask=mask)
        tl.store(p_theta_ptr + state_off, acc_theta * theta, mask=mask)
        if HAS_H0:
            tl.store(gh0_r_ptr + state_off, cr, mask=mask)
            tl.store(gh0_i_ptr + state_off, ci, mask=mask)
    else:
        hr, hi = load_pair(h0_r_ptr, h0_i_ptr, state_off, mask, HAS_H0, BLOCK_M)
        for t in tl.range(0, L, num_stages=NUM_STAGES, loop_unroll_factor=UNROLL):
            tok = row + t
            off = tok * M + lane
            ar, ai, _ = _step_transition(
                eta_ptr, delta_ptr, seg_ptr, rho_ptr, tok, off, mask, nu, cos_theta,
                sin_theta, HAS_RESETS, PRECOMPUTED)
            xr = tl.load(x_r_ptr + off, mask=mask, other=0.0).to(tl.float32)
            xi = tl.load(x_i_ptr + off, mask=mask, other=0.0).to(tl.float32)
            hr, hi = cmul(ar, ai, hr, hi)
            hr += xr
            hi += xi
            tl.store(y_r_ptr + off, hr.to(y_r_ptr.dtype.element_ty), mask=mask)
            tl.store(y_i_ptr + off, hi.to(y_i_ptr.dtype.element_ty), mask=mask)
        tl.store(end_r_ptr + state_off, hr, mask=mask)
        tl.store(end_i_ptr + state_off, hi, mask=mask)
