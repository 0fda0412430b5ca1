"""[CHUNK, BLOCK_M] tile helpers: time indexing, transitions, and the in-tile affine scan.

Every chunk-style kernel (chunk family, look-back) views a chunk of CHUNK time steps and
BLOCK_M modes as one 2-D tile, so loads are wide and coalesced along modes.  The same helpers
serve the forward scan and the backward adjoint scan:

    forward  (REVERSE=False): row r is time t = start + r,        h[t] = A[t] h[t-1] + b[t]
    backward (REVERSE=True):  row r is time t = L - 1 - (start + r), g[t] = conj(A[t+1]) g[t+1] + dout[t]

with A[L] := 1, so in both directions a tile is scanned top to bottom.  Rows outside [0, L)
get the identity map (A = 1, input 0): padding never disturbs a summary or a carry.
"""
import triton
import triton.language as tl


@triton.jit
def affine_combine(a1r, a1i, b1r, b1i, a2r, a2i, b2r, b2i):
    """(A2, b2) after (A1, b1) as affine maps z -> A z + b: (A2 A1, A2 b1 + b2)."""
    return (a2r * a1r - a2i * a1i, a2r * a1i + a2i * a1r,
            a2r * b1r - a2i * b1i + b2r, a2r * b1i + a2i * b1r + b2i)


@triton.jit
def tile_times(start, L, CHUNK: tl.constexpr, REVERSE: tl.constexpr):
    """Time index of each row ([CHUNK], int32) and whether it is inside [0, L)."""
    step = start + tl.arange(0, CHUNK)
    if REVERSE:
        t = L - 1 - step
    else:
        t = step
    return t, (t >= 0) & (t < L)


@triton.jit
def load_transition(eta_ptr, delta_ptr, seg_ptr, row_base, t, valid, nu, cos_theta, sin_theta,
                    HAS_RESETS: tl.constexpr):
    """A[t] for each row of a tile: (ar, ai, log_radius, keep), each [CHUNK, BLOCK_M].

    ``row_base`` is b * L; ``nu``, ``cos_theta``, ``sin_theta`` are [BLOCK_M]; rows with
    ``valid`` false or a reset (segment_pos == 0) get A = 0 and keep = 0.
    log_radius = -nu e^eta is returned for the backward pass (d A / d eta = log_radius * A).
    """
    eta = tl.load(eta_ptr + row_base + t, mask=valid, other=0.0).to(tl.float32)      # [CHUNK]
    delta = tl.load(delta_ptr + row_base + t, mask=valid, other=0.0).to(tl.float32)  # [CHUNK]
    keep = valid
    if HAS_RESETS:
        seg = tl.load(seg_ptr + row_base + t, mask=valid, other=1)
        keep = keep & (seg != 0)
    log_radius = -nu[None, :] * tl.exp(eta)[:, None]                                # [CHUNK, BLOCK_M]
    radius = tl.where(keep[:, None], tl.exp(log_radius), 0.0)
    cd = tl.cos(delta)[:, None]
    sd = tl.sin(delta)[:, None]
    ar = radius * (cos_theta[None, :] * cd - sin_theta[None, :] * sd)
    ai = radius * (sin_theta[None, :] * cd + cos_theta[None, :] * sd)
    return ar, ai, log_radius, keep


@triton.jit
def scan_transition(eta_ptr, delta_ptr, seg_ptr, row_base, t, valid, L, nu, cos_theta,
                    sin_theta, HAS_RESETS: tl.constexpr, REVERSE: tl.constexpr):
    """The map applied at each row of the scan, [CHUNK, BLOCK_M] pairs.

    Forward: A[t].  Reverse: conj(A[t+1]), with A[L] = 1.  Padding rows: identity.
    """
    if REVERSE:
        nxt = t + 1
        inside = valid & (nxt < L)
        ar, ai, _, _ = load_transition(eta_ptr, delta_ptr, seg_ptr, row_base, nxt, inside,
                                       nu, cos_theta, sin_theta, HAS_RESETS)
        ident = (~inside)[:, None]
        return tl.where(ident, 1.0, ar), tl.where(ident, 0.0, -ai)
    else:
        ar, ai, _, _ = load_transition(eta_ptr, delta_ptr, seg_ptr, row_base, t, valid,
                                       nu, cos_theta, sin_theta, HAS_RESETS)
        pad = (~valid)[:, None]
        return tl.where(pad, 1.0, ar), tl.where(pad, 0.0, ai)


@triton.jit
def tile_scan(ar, ai, ur, ui):
    """Inclusive scan of z -> A z + u down the rows (axis 0) of [CHUNK, BLOCK_M] tiles.

    Returns (Pr, Pi, Qr, Qi): row r holds the composition of rows 0..r, i.e. the state after
    row r is P[r] * z_in + Q[r] for a carry-in z_in.
    """
    return tl.associative_scan((ar, ai, ur, ui), 0, affine_combine)


@triton.jit
def transition_gradients(gr, gi, hr, hi, ar, ai, log_radius):
    """Per-element gradients of the transition, [CHUNK, BLOCK_M] each.

    With adjoint g[t] and previous state h[t-1]: dL/dA = g * conj(h) as (d/dAr, d/dAi);
    d/d eta = log_radius * Re(conj(dL/dA) A), d/d delta = Im(conj(dL/dA) A) -- the latter times
    theta is d/d theta_log, the former summed is d/d nu_log.
    """
    dar = gr * hr + gi * hi
    dai = gi * hr - gr * hi
    return log_radius * (dar * ar + dai * ai), dai * ar - dar * ai
