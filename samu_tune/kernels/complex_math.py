"""Tiny ``@triton.jit`` helpers reused by every kernel: complex products and the transition."""
import triton
import triton.language as tl


@triton.jit
def cmul(ar, ai, br, bi):
    """(ar + i ai) * (br + i bi)."""
    return ar * br - ai * bi, ar * bi + ai * br


@triton.jit
def cmul_add(ar, ai, br, bi, cr, ci):
    """(ar + i ai) * (br + i bi) + (cr + i ci), ordered so that each part contracts into two
    fused multiply-adds (fma(-ai, bi, fma(ar, br, cr))) instead of a multiply, a
    multiply-add and an add."""
    return (cr + ar * br) - ai * bi, (ci + ar * bi) + ai * br


@triton.jit
def cmul_conj_add(ar, ai, br, bi, cr, ci):
    """conj(ar + i ai) * (br + i bi) + (cr + i ci), contracted as :func:`cmul_add`."""
    return (cr + ar * br) + ai * bi, (ci + ar * bi) - ai * br


@triton.jit
def cmul_conj(ar, ai, br, bi):
    """conj(ar + i ai) * (br + i bi): the adjoint's transition."""
    return ar * br + ai * bi, ar * bi - ai * br


@triton.jit
def tanh(x):
    """tanh as 2 sigmoid(2x) - 1 (libdevice.tanh is not available under the interpreter)."""
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def spectrum(nu_log_ptr, theta_log_ptr, lane, mask):
    """Per-mode constants, each [BLOCK_M]: nu, theta, cos(theta), sin(theta)."""
    nu = tl.exp(tl.load(nu_log_ptr + lane, mask=mask, other=0.0).to(tl.float32))
    theta = tl.exp(tl.load(theta_log_ptr + lane, mask=mask, other=0.0).to(tl.float32))
    return nu, theta, tl.cos(theta), tl.sin(theta)


@triton.jit
def transition(nu, cos_theta, sin_theta, eta, delta):
    """A = exp(-nu e^eta) * exp(i (theta + delta)) from per-token eta, delta.

    cos/sin(theta + delta) by angle addition: one cos/sin per token instead of per (token,
    mode).  Returns (ar, ai, log_radius) with log_radius = -nu e^eta (needed by backward).
    """
    return transition_cs(nu, cos_theta, sin_theta, tl.exp(eta), tl.cos(delta), tl.sin(delta))


@triton.jit
def transition_cs(nu, cos_theta, sin_theta, exp_eta, cos_delta, sin_delta):
    """:func:`transition` from the token's e^eta, cos delta, sin delta (computed once per
    token: :mod:`samu_tune.kernels.controls`).  Returns (ar, ai, log_radius)."""
    log_radius = -nu * exp_eta
    # exp2 of a loop-invariant rescaled nu: one multiply and a flush-to-zero ex2 per (token,
    # mode); tl.exp(log_radius) costs a multiply by log2(e) and a denormal fix-up around ex2
    # (four more instructions on sm_90).  Radii below 2^-126 flush to 0.
    radius = tl.exp2((nu * -1.4426950408889634) * exp_eta)
    return (radius * (cos_theta * cos_delta - sin_theta * sin_delta),
            radius * (sin_theta * cos_delta + cos_theta * sin_delta), log_radius)


@triton.jit
def polar(radius, cos_theta, sin_theta, delta):
    """radius * exp(i (theta + delta)) from cos/sin(theta) and a per-token delta.

    The rotation half of :func:`transition`, for kernels whose radius comes from elsewhere
    (a precomputed decay) or is masked (resets).  Returns (ar, ai).
    """
    cd, sd = tl.cos(delta), tl.sin(delta)
    return (radius * (cos_theta * cd - sin_theta * sd),
            radius * (sin_theta * cd + cos_theta * sd))


@triton.jit
def round_like(w, DTYPE: tl.constexpr):
    """fp32 ``w`` rounded to DTYPE's precision (round to nearest even), kept in fp32.

    bf16 by integer arithmetic on the bits (the Triton interpreter's fp32 -> bf16 cast does not
    round to nearest even: half of random values came out one ulp off, so a write rounded in a
    kernel would not match the same write rounded by torch); fp16 by a cast; fp32 unchanged.
    Finite values only (the layer's writes)."""
    if DTYPE == tl.bfloat16:
        bits = w.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16 << 16
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        return w.to(tl.float16).to(tl.float32)
    else:
        return w


@triton.jit
def load_pair(r_ptr, i_ptr, off, mask, HAS: tl.constexpr, BLOCK_M: tl.constexpr):
    """A complex [BLOCK_M] vector as fp32 (re, im): loaded at ``off`` (masked lanes 0) when
    ``HAS``, else zeros (the pointers may then be None): an initial state, a final-state
    gradient, a carry-in.  The serial and prefix kernels use it; the look-back and chunk-walk
    kernels keep the same lines inline, where the extra inline scope changed ptxas's schedule
    of a backward launch (docs/performance.md, "Shared kernel helpers")."""
    if HAS:
        r = tl.load(r_ptr + off, mask=mask, other=0.0).to(tl.float32)
        i = tl.load(i_ptr + off, mask=mask, other=0.0).to(tl.float32)
    else:
        r = tl.zeros((BLOCK_M,), tl.float32)
        i = tl.zeros((BLOCK_M,), tl.float32)
    return r, i
