"""One SAMU decode step (controller, transition, write, state update, ReLU) as one kernel.

Grid ``(programs, B)``: program ``(p, b)`` handles mode tiles ``[p * tiles_per_program,
(p + 1) * tiles_per_program)`` of batch row b.  With one program per row
(``tiles_per_program = cdiv(M, BLOCK_M)``) this is the seed's ``_samu_decode``; with one
program per mode tile it is ``_samu_decode_blocked`` (each program recomputes the two
length-2M controller dot products, which is cheaper than a second launch).  B, M and the tile
counts are runtime values: one binary per (BLOCK_D, BLOCK_M, dtype).
"""
import triton
import triton.language as tl

from .complex_math import spectrum, transition


@triton.jit
def tanh(x):
    # libdevice.tanh is not available under the interpreter.
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def controls(x_row, phase_direction, radial_direction, phase_amplitude, radial_amplitude,
             width, scale, BLOCK_D: tl.constexpr):
    """(eta, delta) of one token x_row [width]: the normalised projections through tanh.

    q = ([x, 1] . d) / max(|d|, 1e-12) for both directions d [width + 1];
    delta = tanh(a_p) tanh(q_p) * scale, eta = tanh(a_r) r / (1 + r^2) * scale, r = tanh(q_r).
    """
    offs = tl.arange(0, BLOCK_D)
    dot_p = tl.zeros((BLOCK_D,), tl.float32)
    dot_r = tl.zeros((BLOCK_D,), tl.float32)
    sq_p = tl.zeros((BLOCK_D,), tl.float32)
    sq_r = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, width, BLOCK_D):
        lane = start + offs                                                       # [BLOCK_D]
        m = lane < width
        xv = tl.load(x_row + lane, mask=m, other=0.0).to(tl.float32)
        pv = tl.load(phase_direction + lane, mask=m, other=0.0).to(tl.float32)
        rv = tl.load(radial_direction + lane, mask=m, other=0.0).to(tl.float32)
        dot_p += xv * pv
        dot_r += xv * rv
        sq_p += pv * pv
        sq_r += rv * rv
    bias_p = tl.load(phase_direction + width).to(tl.float32)
    bias_r = tl.load(radial_direction + width).to(tl.float32)
    norm_p = tl.maximum(tl.sqrt(tl.sum(sq_p, axis=0) + bias_p * bias_p), 1e-12)
    norm_r = tl.maximum(tl.sqrt(tl.sum(sq_r, axis=0) + bias_r * bias_r), 1e-12)
    q_p = (tl.sum(dot_p, axis=0) + bias_p) / norm_p
    r = tanh((tl.sum(dot_r, axis=0) + bias_r) / norm_r)
    delta = tanh(tl.load(phase_amplitude).to(tl.float32)) * tanh(q_p) * scale
    eta = tanh(tl.load(radial_amplitude).to(tl.float32)) * r / (1.0 + r * r) * scale
    return eta, delta


@triton.jit
def samu_decode_step(x, phase_direction, radial_direction, phase_amplitude, radial_amplitude,
                     nu_log, theta_log, state_r, state_i, out, last_r, last_i,
                     modes, tiles_per_program, scale,
                     HAS_STATE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """x, out: [B, 2M]; state_*, last_*: fp32 [B, M]; directions [2M+1]; amplitudes 0-d.

    h' = A h + (x[:M] + i x[M:]) gamma (the write rounded to x's dtype, as the layer's
    training path stores it); last = h' (fp32); out = relu(cat(Re h', Im h')) in out's dtype.
    """
    first_tile = tl.program_id(0) * tiles_per_program
    b = tl.program_id(1).to(tl.int64)
    width = 2 * modes
    x_row = x + b * width
    out_row = out + b * width
    eta, delta = controls(x_row, phase_direction, radial_direction, phase_amplitude,
                          radial_amplitude, width, scale, BLOCK_D)
    for k in range(0, tiles_per_program):
        lane = (first_tile + k) * BLOCK_M + tl.arange(0, BLOCK_M)                # [BLOCK_M]
        mask = lane < modes
        nu, theta, cos_theta, sin_theta = spectrum(nu_log, theta_log, lane, mask)
        ar, ai, _ = transition(nu, cos_theta, sin_theta, eta, delta)
        gamma = tl.sqrt(tl.maximum(1.0 - tl.exp(-2.0 * nu), 0.0)) + 1.0e-8
        wr = tl.load(x_row + lane, mask=mask, other=0.0).to(tl.float32) * gamma
        wi = tl.load(x_row + modes + lane, mask=mask, other=0.0).to(tl.float32) * gamma
        wr = wr.to(x.dtype.element_ty).to(tl.float32)
        wi = wi.to(x.dtype.element_ty).to(tl.float32)
        if HAS_STATE:
            hr = tl.load(state_r + b * modes + lane, mask=mask, other=0.0).to(tl.float32)
            hi = tl.load(state_i + b * modes + lane, mask=mask, other=0.0).to(tl.float32)
            nr = ar * hr - ai * hi + wr
            ni = ai * hr + ar * hi + wi
        else:
            nr, ni = wr, wi
        tl.store(last_r + b * modes + lane, nr, mask=mask)
        tl.store(last_i + b * modes + lane, ni, mask=mask)
        tl.store(out_row + lane, tl.maximum(nr, 0.0), mask=mask)
        tl.store(out_row + modes + lane, tl.maximum(ni, 0.0), mask=mask)
