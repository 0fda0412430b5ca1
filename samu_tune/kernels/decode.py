"""One SAMU decode step (controller, transition, write, state update, ReLU) as one kernel.

The parameters arrive pre-digested in one fp32 buffer ``consts`` (built once per parameter
version by :func:`samu_tune.ops.decode.step.decode_constants`; one pointer instead of six keeps
Triton's per-launch argument handling short, and the per-mode exp/cos/sin and the direction
norms leave the per-token path).  Layout, M = ``modes``, W = 2M + 1::

    [0, M) nu   [M, 2M) cos theta   [2M, 3M) sin theta   [3M, 4M) gamma
    [4M, 4M + W) unit phase direction     [4M + W, 4M + 2W) unit radial direction
    4M + 2W: tanh(a_p) / sqrt(M)          4M + 2W + 1: tanh(a_r) / sqrt(M)

Grid ``(programs, B)``: program ``(p, b)`` handles mode tiles ``[p * tiles_per_program,
(p + 1) * tiles_per_program)`` of batch row b.  With one program per row
(``tiles_per_program = cdiv(M, BLOCK_M)``) this is the seed's ``_samu_decode``; with one
program per mode tile it is ``_samu_decode_blocked`` (each program recomputes the two
length-2M controller dot products, which is cheaper than a second launch).  B, M and the tile
counts are runtime values: one binary per (BLOCK_D, BLOCK_M, dtype).

Each state element is read and then written by the same lane of the same program, so the new
state may be written over the old one (``last_* = state_*``).
"""
import triton
import triton.language as tl

from samu_tune.kernels.complex_math import polar, tanh


@triton.jit
def controls(x_row, consts, modes, BLOCK_D: tl.constexpr):
    """(eta, delta) of one token x_row [2M] from the unit directions and amplitude scales.

    q = [x, 1] . d (d already unit); delta = s_p tanh(q_p), eta = s_r r / (1 + r^2) with
    r = tanh(q_r) and s = tanh(a) / sqrt(M).
    """
    width = 2 * modes
    dir_p = consts + 4 * modes
    dir_r = dir_p + width + 1
    offs = tl.arange(0, BLOCK_D)
    dot_p = tl.zeros((BLOCK_D,), tl.float32)
    dot_r = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, width, BLOCK_D):
        lane = start + offs                                                       # [BLOCK_D]
        m = lane < width
        xv = tl.load(x_row + lane, mask=m, other=0.0).to(tl.float32)
        dot_p += xv * tl.load(dir_p + lane, mask=m, other=0.0)
        dot_r += xv * tl.load(dir_r + lane, mask=m, other=0.0)
    q_p = tl.sum(dot_p, axis=0) + tl.load(dir_p + width)
    r = tanh(tl.sum(dot_r, axis=0) + tl.load(dir_r + width))
    scales = dir_r + width + 1
    delta = tl.load(scales) * tanh(q_p)
    eta = tl.load(scales + 1) * r / (1.0 + r * r)
    return eta, delta


@triton.jit
def samu_decode_step(x, consts, state_r, state_i, out, last_r, last_i, modes, tiles_per_program,
                     HAS_STATE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """x, out: [B, 2M] contiguous; consts: fp32 (module docstring); state_*, last_*: fp32 [B, M].

    h' = A h + (x[:M] + i x[M:]) gamma, A = exp(-nu e^eta) e^{i (theta + delta)} (the write
    rounded to x's dtype, as the layer's training path stores it); last = h' (fp32);
    out = relu(cat(Re h', Im h')) in out's dtype.
    """
    first_tile = tl.program_id(0) * tiles_per_program
    b = tl.program_id(1).to(tl.int64)
    x_row = x + b * 2 * modes
    out_row = out + b * 2 * modes
    eta, delta = controls(x_row, consts, modes, BLOCK_D)
    growth = tl.exp(eta)
    for k in range(0, tiles_per_program):
        lane = (first_tile + k) * BLOCK_M + tl.arange(0, BLOCK_M)                # [BLOCK_M]
        mask = lane < modes
        nu = tl.load(consts + lane, mask=mask, other=0.0)
        cos_theta = tl.load(consts + modes + lane, mask=mask, other=1.0)
        sin_theta = tl.load(consts + 2 * modes + lane, mask=mask, other=0.0)
        gamma = tl.load(consts + 3 * modes + lane, mask=mask, other=0.0)
        ar, ai = polar(tl.exp(-nu * growth), cos_theta, sin_theta, delta)
        wr = tl.load(x_row + lane, mask=mask, other=0.0).to(tl.float32) * gamma
        wi = tl.load(x_row + modes + lane, mask=mask, other=0.0).to(tl.float32) * gamma
        wr = wr.to(x.dtype.element_ty).to(tl.float32)
        wi = wi.to(x.dtype.element_ty).to(tl.float32)
        if HAS_STATE:
            hr = tl.load(state_r + b * modes + lane, mask=mask, other=0.0)
            hi = tl.load(state_i + b * modes + lane, mask=mask, other=0.0)
            nr = ar * hr - ai * hi + wr
            ni = ai * hr + ar * hi + wi
        else:
            nr, ni = wr, wi
        tl.store(last_r + b * modes + lane, nr, mask=mask)
        tl.store(last_i + b * modes + lane, ni, mask=mask)
        tl.store(out_row + lane, tl.maximum(nr, 0.0), mask=mask)
        tl.store(out_row + modes + lane, tl.maximum(ni, 0.0), mask=mask)
