"""Generic diagonal linear recurrences ``h[t] = a[t] * h[t-1] + x[t]`` over [B, L, D], real or
complex (``COMPLEX``), forward or adjoint, left-to-right or right-to-left.

One set of kernels serves every direction and the backward pass.  The scan visits steps
s = 0..L-1 at times ``t = s`` (``REVERSE=False``) or ``t = L-1-s`` (``REVERSE=True``):

    ADJOINT=False:  h[t] = a[t] h[prev] + x[t],          h before the first step = h0
    ADJOINT=True:   g[t] = conj(a[prev]) g[prev] + x[t],  no transition at the first step,
                    grad_a[t] = g[t] conj(f[next])  (f: the forward outputs, f[-1] = f_h0),
                    last = conj(a[t_final]) g[t_final]  (the gradient of the forward h0)

where prev/next are the times of the previous/next step in this scan's order.  The backward
of a scan in one direction is the ADJOINT scan in the other direction with x = dout and
h0 = d(final state).  Complex values travel as (real, imag) pairs; in real mode the imaginary
pointers are never touched.  B, L, D and chunk counts are runtime values, never specialised
on (``do_not_specialize``): one binary serves every length and width, so a new L or D, or the
tuner's small verification problem, reuses the binary that the last one compiled.
"""
import triton
import triton.language as tl


@triton.jit
def load_pair(ptr_r, ptr_i, offs, mask, other_r, COMPLEX: tl.constexpr):
    """(re, im) as fp32; im is 0 in real mode."""
    re = tl.load(ptr_r + offs, mask=mask, other=other_r).to(tl.float32)
    if COMPLEX:
        im = tl.load(ptr_i + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        im = tl.zeros_like(re)
    return re, im


@triton.jit
def store_pair(ptr_r, ptr_i, offs, re, im, mask, COMPLEX: tl.constexpr):
    tl.store(ptr_r + offs, re, mask=mask)
    if COMPLEX:
        tl.store(ptr_i + offs, im, mask=mask)


@triton.jit
def mul(ar, ai, br, bi, COMPLEX: tl.constexpr):
    """a * b (complex product, or the real product with im untouched)."""
    if COMPLEX:
        return ar * br - ai * bi, ar * bi + ai * br
    else:
        return ar * br, bi


@triton.jit
def mul_conj(ar, ai, br, bi, COMPLEX: tl.constexpr):
    """conj(a) * b."""
    if COMPLEX:
        return ar * br + ai * bi, ar * bi - ai * br
    else:
        return ar * br, bi


@triton.jit
def real_combine(a1, u1, a2, u2):
    """(a2, u2) after (a1, u1) as maps z -> a z + u."""
    return a2 * a1, a2 * u1 + u2


@triton.jit
def complex_combine(a1r, a1i, u1r, u1i, a2r, a2i, u2r, u2i):
    return (a2r * a1r - a2i * a1i, a2r * a1i + a2i * a1r,
            a2r * u1r - a2i * u1i + u2r, a2r * u1i + a2i * u1r + u2i)


@triton.jit
def step_time(s, L, REVERSE: tl.constexpr):
    if REVERSE:
        return L - 1 - s
    else:
        return s


@triton.jit(do_not_specialize=["L", "D"])
def linear_serial_scan(a_r, a_i, x_r, x_i, h0_r, h0_i, out_r, out_i, last_r, last_i,
                       f_r, f_i, f0_r, f0_i, ga_r, ga_i, L, D,
                       COMPLEX: tl.constexpr, REVERSE: tl.constexpr, ADJOINT: tl.constexpr,
                       HAS_H0: tl.constexpr, HAS_F0: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (D tile, row) walks all L steps with the state in registers.

    a, x, out, f, ga: [B, L, D]; h0, last, f0: [B, D]; out/ga in their buffers' dtypes.
    """
    b = tl.program_id(1).to(tl.int64)
    lane = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)                      # [BLOCK_D]
    mask = lane < D
    if HAS_H0:
        hr, hi = load_pair(h0_r, h0_i, b * D + lane, mask, 0.0, COMPLEX)
    else:
        hr = tl.zeros((BLOCK_D,), tl.float32)
        hi = tl.zeros((BLOCK_D,), tl.float32)
    if ADJOINT:
        # a of the previous step (identity before the first) and the forward h0.
        pr = tl.full((BLOCK_D,), 1.0, tl.float32)
        pi = tl.zeros((BLOCK_D,), tl.float32)
        if HAS_F0:
            f0r, f0i = load_pair(f0_r, f0_i, b * D + lane, mask, 0.0, COMPLEX)
        else:
            f0r = tl.zeros((BLOCK_D,), tl.float32)
            f0i = tl.zeros((BLOCK_D,), tl.float32)
    for s in range(0, L):
        t = step_time(s, L, REVERSE)
        offs = (b * L + t) * D + lane
        ar, ai = load_pair(a_r, a_i, offs, mask, 1.0, COMPLEX)
        xr, xi = load_pair(x_r, x_i, offs, mask, 0.0, COMPLEX)
        if ADJOINT:
            hr, hi = mul_conj(pr, pi, hr, hi, COMPLEX)
            pr, pi = ar, ai
        else:
            hr, hi = mul(ar, ai, hr, hi, COMPLEX)
        hr += xr
        hi += xi
        store_pair(out_r, out_i, offs, hr, hi, mask, COMPLEX)
        if ADJOINT:
            t_next = step_time(s + 1, L, REVERSE) + tl.zeros((BLOCK_D,), tl.int32)  # [BLOCK_D]
            inside = (t_next >= 0) & (t_next < L)
            fr, fi = load_pair(f_r, f_i, (b * L + t_next) * D + lane, mask & inside, 0.0,
                               COMPLEX)
            fr = tl.where(inside, fr, f0r)
            fi = tl.where(inside, fi, f0i)
            gr, gi = mul_conj(fr, fi, hr, hi, COMPLEX)                         # g conj(f)
            store_pair(ga_r, ga_i, offs, gr, gi, mask, COMPLEX)
    if ADJOINT:
        hr, hi = mul_conj(pr, pi, hr, hi, COMPLEX)
    store_pair(last_r, last_i, b * D + lane, hr, hi, mask, COMPLEX)


@triton.jit
def chunk_tile(a_r, a_i, x_r, x_i, b, chunk, L, D, lane, mask,
               COMPLEX: tl.constexpr, REVERSE: tl.constexpr, ADJOINT: tl.constexpr,
               CHUNK: tl.constexpr):
    """The maps of one chunk, [CHUNK, BLOCK_D] each: (tr, ti, ur, ui, valid2, offs).

    Row r is step s = chunk * CHUNK + r.  Padding rows (s >= L) are the identity map, so the
    last row of the in-tile scan is the whole chunk's map.
    """
    s = chunk * CHUNK + tl.arange(0, CHUNK)                                        # [CHUNK]
    valid = s < L
    t = step_time(s, L, REVERSE)
    valid2 = valid[:, None] & mask[None, :]                                        # [CHUNK, BLOCK_D]
    offs = (b * L + t)[:, None] * D + lane[None, :]
    ur, ui = load_pair(x_r, x_i, offs, valid2, 0.0, COMPLEX)
    if ADJOINT:
        t_prev = step_time(s - 1, L, REVERSE)
        has_prev = valid2 & (s >= 1)[:, None]
        tr, ti = load_pair(a_r, a_i, (b * L + t_prev)[:, None] * D + lane[None, :], has_prev,
                           1.0, COMPLEX)
        ti = -ti
    else:
        tr, ti = load_pair(a_r, a_i, offs, valid2, 1.0, COMPLEX)
    return tr, ti, ur, ui, valid2, offs


@triton.jit
def tile_scan(tr, ti, ur, ui, COMPLEX: tl.constexpr):
    """Inclusive scan of z -> T z + U down the rows: (Pr, Pi, Qr, Qi), [CHUNK, BLOCK_D] each."""
    if COMPLEX:
        pr, pi, qr, qi = tl.associative_scan((tr, ti, ur, ui), 0, complex_combine)
    else:
        pr, qr = tl.associative_scan((tr, ur), 0, real_combine)
        pi = tl.zeros_like(pr)
        qi = tl.zeros_like(qr)
    return pr, pi, qr, qi


@triton.jit(do_not_specialize=["L", "D", "n_chunks"])
def linear_chunk_summary(a_r, a_i, x_r, x_i, p_r, p_i, q_r, q_i, L, D, n_chunks,
                         COMPLEX: tl.constexpr, REVERSE: tl.constexpr, ADJOINT: tl.constexpr,
                         CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (D tile, row * n_chunks + chunk): the chunk's map z -> P z + Q into p, q
    ([B, n_chunks, D] fp32)."""
    bc = tl.program_id(1)
    b = (bc // n_chunks).to(tl.int64)
    chunk = bc % n_chunks
    lane = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = lane < D
    tr, ti, ur, ui, _, _ = chunk_tile(a_r, a_i, x_r, x_i, b, chunk, L, D, lane, mask,
                                      COMPLEX, REVERSE, ADJOINT, CHUNK)
    pr, pi, qr, qi = tile_scan(tr, ti, ur, ui, COMPLEX)
    is_last = (tl.arange(0, CHUNK) == CHUNK - 1)[:, None]                          # [CHUNK, 1]
    sr = tl.sum(tl.where(is_last, pr, 0.0), axis=0)                                # [BLOCK_D]
    si = tl.sum(tl.where(is_last, pi, 0.0), axis=0)
    vr = tl.sum(tl.where(is_last, qr, 0.0), axis=0)
    vi = tl.sum(tl.where(is_last, qi, 0.0), axis=0)
    offs = (b * n_chunks + chunk) * D + lane
    store_pair(p_r, p_i, offs, sr, si, mask, COMPLEX)
    store_pair(q_r, q_i, offs, vr, vi, mask, COMPLEX)


@triton.jit(do_not_specialize=["L", "D", "n_chunks"])
def linear_chunk_prefix(p_r, p_i, q_r, q_i, h0_r, h0_i, carry_r, carry_i, last_r, last_i,
                        a_r, a_i, L, D, n_chunks,
                        COMPLEX: tl.constexpr, REVERSE: tl.constexpr, ADJOINT: tl.constexpr,
                        HAS_H0: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (D tile, row): serial over chunks, the state entering each chunk -> carry
    ([B, n_chunks, D] fp32) and the final state (adjoint: the forward h0's gradient) -> last."""
    b = tl.program_id(1).to(tl.int64)
    lane = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = lane < D
    if HAS_H0:
        hr, hi = load_pair(h0_r, h0_i, b * D + lane, mask, 0.0, COMPLEX)
    else:
        hr = tl.zeros((BLOCK_D,), tl.float32)
        hi = tl.zeros((BLOCK_D,), tl.float32)
    for c in range(0, n_chunks):
        offs = (b * n_chunks + c) * D + lane
        store_pair(carry_r, carry_i, offs, hr, hi, mask, COMPLEX)
        pr, pi = load_pair(p_r, p_i, offs, mask, 1.0, COMPLEX)
        qr, qi = load_pair(q_r, q_i, offs, mask, 0.0, COMPLEX)
        hr, hi = mul(pr, pi, hr, hi, COMPLEX)
        hr += qr
        hi += qi
    if ADJOINT:
        t_final = step_time(L - 1, L, REVERSE)
        ar, ai = load_pair(a_r, a_i, (b * L + t_final) * D + lane, mask, 1.0, COMPLEX)
        hr, hi = mul_conj(ar, ai, hr, hi, COMPLEX)
    store_pair(last_r, last_i, b * D + lane, hr, hi, mask, COMPLEX)


@triton.jit(do_not_specialize=["L", "D", "n_chunks"])
def linear_chunk_replay(a_r, a_i, x_r, x_i, carry_r, carry_i, out_r, out_i,
                        f_r, f_i, f0_r, f0_i, ga_r, ga_i, L, D, n_chunks,
                        COMPLEX: tl.constexpr, REVERSE: tl.constexpr, ADJOINT: tl.constexpr,
                        HAS_F0: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (D tile, row * n_chunks + chunk): out = P * carry + Q on every row of the chunk;
    in adjoint mode also grad_a = g conj(f[next])."""
    bc = tl.program_id(1)
    b = (bc // n_chunks).to(tl.int64)
    chunk = bc % n_chunks
    lane = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = lane < D
    tr, ti, ur, ui, valid2, offs = chunk_tile(a_r, a_i, x_r, x_i, b, chunk, L, D, lane, mask,
                                              COMPLEX, REVERSE, ADJOINT, CHUNK)
    pr, pi, qr, qi = tile_scan(tr, ti, ur, ui, COMPLEX)
    cr, ci = load_pair(carry_r, carry_i, (b * n_chunks + chunk) * D + lane, mask, 0.0, COMPLEX)
    hr, hi = mul(pr, pi, cr[None, :], ci[None, :], COMPLEX)                       # [CHUNK, BLOCK_D]
    hr += qr
    hi += qi
    store_pair(out_r, out_i, offs, hr, hi, valid2, COMPLEX)
    if ADJOINT:
        s = chunk * CHUNK + tl.arange(0, CHUNK)
        t_next = step_time(s + 1, L, REVERSE)                                      # [CHUNK]
        inside = ((t_next >= 0) & (t_next < L))[:, None]
        fr, fi = load_pair(f_r, f_i, (b * L + t_next)[:, None] * D + lane[None, :],
                           valid2 & inside, 0.0, COMPLEX)
        if HAS_F0:
            f0r, f0i = load_pair(f0_r, f0_i, b * D + lane, mask, 0.0, COMPLEX)
            fr = tl.where(inside, fr, f0r[None, :])
            fi = tl.where(inside, fi, f0i[None, :])
        gr, gi = mul_conj(fr, fi, hr, hi, COMPLEX)                             # g conj(f)
        store_pair(ga_r, ga_i, offs, gr, gi, valid2, COMPLEX)
