"""The SAMU controller, forward and backward, over tiles of tokens.

For the T = B L tokens of x [T, K] (K = 2M, contiguous rows, any float dtype), the unit
directions D [2, K + 1] fp32 (row 0 phase, row 1 radial; column K weighs the bias
coordinate) and the amplitude scales S = (tanh a_p, tanh a_r) / sqrt(M) (fp32 [2])::

    q_c[t] = sum_k x[t, k] D[c, k] + D[c, K]        s_c = tanh(q_c)        (c = 0, 1)
    delta[t] = S_0 s_0                              eta[t] = S_1 r / (1 + r^2),  r = s_1

Backward, from d_eta, d_delta [T] (fp32), with u = 1 + r^2::

    dq_0 = d_delta S_0 (1 - s_0^2)                  dq_1 = d_eta S_1 ((1 - r^2) / u)^2
    grad x[t, k] = dq_0 D[0, k] + dq_1 D[1, k]
    grad D[c, k] = sum_t dq_c x[t, k]               grad D[c, K] = sum_t dq_c
    grad S_0 = sum_t d_delta s_0                    grad S_1 = sum_t d_eta r / u

(d/dr r/u = (1 - r^2)/u^2 and dr/dq_1 = 1 - r^2.)  Arithmetic is fp32 whatever x's dtype; x
is read in its own dtype once per pass.  T and K are runtime values, not specialised (one
binary per dtype, tile and flags); K_ALIGN (8 or 1): K is a multiple of it, so that rows of
x and grad x move in 16-byte vectors (as the scan's M_ALIGN).
"""
import triton
import triton.language as tl

from samu_tune.kernels.complex_math import tanh
from samu_tune.kernels.controls import store_rows
from samu_tune.kernels.operands import norm, operands_job

# fp32 columns per (program, c) row of the backward partials: grad D[c, :K+1], grad S_c
PARTIAL_EXTRA = tl.constexpr(2)


@triton.jit(do_not_specialize=["T", "K", "out_stride", "M"])
def controller_forward(x_ptr, dirs_ptr, scales_ptr, out_ptr, out_stride, table_ptr, seg_ptr,
                       pd_ptr, rd_ptr, pa_ptr, ra_ptr, nu_log_ptr, gamma_ptr, T, K, M,
                       inv_sqrt_m, HAS_TABLE: tl.constexpr, HAS_RESETS: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, K_ALIGN: tl.constexpr = 1,
                       RAW: tl.constexpr = False, RAW_BLOCK: tl.constexpr = 512):
    """Grid (cdiv(T, BLOCK_T),): one program per BLOCK_T tokens walks K in [BLOCK_T, BLOCK_K]
    tiles.  Writes the rows of out [4, T] (``out_stride`` apart) fp32: eta, delta, s_0 and r
    (s_0 and r are what backward needs instead of x's dot products; one base pointer, not
    four: each view passed costs the host a tensor operation) and, when HAS_TABLE, the scan's
    control-table rows of the tokens (:func:`samu_tune.kernels.controls.store_rows`; seg [T]
    resets them).

    RAW: the SAMU layer's raw parameters instead of the unit directions and scales (the
    operands, :mod:`samu_tune.kernels.operands`): phase and radial directions pd, rd [K + 1],
    amplitudes pa, ra (0-d), nu_log [M].  Every program normalises the directions itself
    (two passes over K + 1 entries, read from L2: the reduction of the operands kernel,
    ``RAW_BLOCK`` wide, so the unit directions agree bitwise), and the programs also write the
    operands into dirs [2, K + 1], scales [2] and gamma [M] (its jobs, grid-strided), which
    the scan and backward read: the operands launch is folded into this one."""
    if K_ALIGN > 1:
        K = K // K_ALIGN * K_ALIGN
    if RAW:
        n_p = norm(pd_ptr, K + 1, RAW_BLOCK)
        n_r = norm(rd_ptr, K + 1, RAW_BLOCK)
        src_p = pd_ptr
        src_r = rd_ptr
        sc_p = tanh(tl.load(pa_ptr)) * inv_sqrt_m
        sc_r = tanh(tl.load(ra_ptr)) * inv_sqrt_m
        n_jobs = 2 + tl.cdiv(M, RAW_BLOCK)
        for job in range(tl.program_id(0), n_jobs, tl.num_programs(0)):
            operands_job(job, pd_ptr, rd_ptr, pa_ptr, ra_ptr, nu_log_ptr, dirs_ptr, scales_ptr,
                         gamma_ptr, K + 1, M, inv_sqrt_m, RAW_BLOCK)
    else:
        n_p = 1.0
        n_r = 1.0
        src_p = dirs_ptr
        src_r = dirs_ptr + (K + 1)
        sc_p = tl.load(scales_ptr)
        sc_r = tl.load(scales_ptr + 1)
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)        # [BLOCK_T]
    ok = tok < T
    offs = tl.arange(0, BLOCK_K)                                                  # [BLOCK_K]
    rows = x_ptr + tok[:, None] * K                                               # [BLOCK_T, 1]
    # products summed per lane, reduced across lanes once after the walk
    acc_p = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    acc_r = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        col = k0 + offs
        cm = col < K
        # [BLOCK_T, BLOCK_K]
        xv = tl.load(rows + col[None, :], mask=ok[:, None] & cm[None, :], other=0.0).to(tl.float32)
        # unit directions (RAW: divided here, as the operands kernel divides them)
        d_p = tl.load(src_p + col, mask=cm, other=0.0) / n_p
        d_r = tl.load(src_r + col, mask=cm, other=0.0) / n_r
        acc_p += xv * d_p[None, :]
        acc_r += xv * d_r[None, :]
    s_p = tanh(tl.sum(acc_p, axis=1) + tl.load(src_p + K) / n_p)                  # [BLOCK_T]
    r = tanh(tl.sum(acc_r, axis=1) + tl.load(src_r + K) / n_r)
    delta = sc_p * s_p
    eta = sc_r * r / (1.0 + r * r)
    tl.store(out_ptr + tok, eta, mask=ok)
    tl.store(out_ptr + out_stride + tok, delta, mask=ok)
    tl.store(out_ptr + 2 * out_stride + tok, s_p, mask=ok)
    tl.store(out_ptr + 3 * out_stride + tok, r, mask=ok)
    if HAS_TABLE:
        store_rows(table_ptr, seg_ptr, tok, ok, eta, delta, HAS_RESETS)


@triton.jit(do_not_specialize=["T", "K", "tokens_per_program", "s_stride"])
def controller_backward(x_ptr, dirs_ptr, scales_ptr, s_ptr, s_stride, d_eta_ptr, d_delta_ptr,
                        gx_ptr, partial_ptr, T, K, tokens_per_program, ACCUMULATE: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                        K_ALIGN: tl.constexpr = 1):
    """Grid (cdiv(T, tokens_per_program), cdiv(K, BLOCK_K)); tokens_per_program a multiple of
    BLOCK_T.  Program (g, j) walks its tokens in [BLOCK_T, BLOCK_K] tiles of columns
    j BLOCK_K + [0, BLOCK_K): writes grad x there (x's dtype; ACCUMULATE: adds to the grad x
    already in gx, e.g. the fused scan's, in one read-modify-write) and its partial sums to
    partials [n_programs_g, 2, K + 2] fp32: row (g, c) holds sum_t dq_c x[t, k] in columns
    k < K and, from j = 0 only, sum_t dq_c in column K and the grad S_c partial in K + 1.
    dq is recomputed from s_0, r (the rows of s [2, T], ``s_stride`` apart), d_eta, d_delta
    (16 bytes a token) by every column program."""
    if K_ALIGN > 1:
        K = K // K_ALIGN * K_ALIGN
    g = tl.program_id(0)
    j = tl.program_id(1)
    col = j * BLOCK_K + tl.arange(0, BLOCK_K)                                     # [BLOCK_K]
    cm = col < K
    d_p = tl.load(dirs_ptr + col, mask=cm, other=0.0)[None, :]                   # [1, BLOCK_K]
    d_r = tl.load(dirs_ptr + (K + 1) + col, mask=cm, other=0.0)[None, :]
    sc_p = tl.load(scales_ptr)
    sc_r = tl.load(scales_ptr + 1)
    acc_p = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)                              # sum dq_p x
    acc_r = tl.zeros((BLOCK_T, BLOCK_K), tl.float32)                              # sum dq_r x
    bias_p = tl.zeros((BLOCK_T,), tl.float32)                                     # sum dq_p
    bias_r = tl.zeros((BLOCK_T,), tl.float32)
    amp_p = tl.zeros((BLOCK_T,), tl.float32)                                      # grad S_p
    amp_r = tl.zeros((BLOCK_T,), tl.float32)
    first = g.to(tl.int64) * tokens_per_program
    for t0 in range(0, tokens_per_program, BLOCK_T):
        tok = first + t0 + tl.arange(0, BLOCK_T)                                  # [BLOCK_T]
        ok = tok < T
        # masked tokens: s = d = 0, so dq = 0 and they add nothing
        s_p = tl.load(s_ptr + tok, mask=ok, other=0.0)
        r = tl.load(s_ptr + s_stride + tok, mask=ok, other=0.0)
        d_delta = tl.load(d_delta_ptr + tok, mask=ok, other=0.0)
        d_eta = tl.load(d_eta_ptr + tok, mask=ok, other=0.0)
        u = 1.0 + r * r
        w = (1.0 - r * r) / u
        dq_p = d_delta * sc_p * (1.0 - s_p * s_p)
        dq_r = d_eta * sc_r * w * w
        bias_p += dq_p
        bias_r += dq_r
        amp_p += d_delta * s_p
        amp_r += d_eta * r / u
        m2 = ok[:, None] & cm[None, :]
        off = tok[:, None] * K + col[None, :]                               # [BLOCK_T, BLOCK_K]
        xv = tl.load(x_ptr + off, mask=m2, other=0.0).to(tl.float32)
        gx = dq_p[:, None] * d_p + dq_r[:, None] * d_r
        if ACCUMULATE:
            gx += tl.load(gx_ptr + off, mask=m2, other=0.0).to(tl.float32)
        tl.store(gx_ptr + off, gx.to(gx_ptr.dtype.element_ty), mask=m2)
        acc_p += dq_p[:, None] * xv
        acc_r += dq_r[:, None] * xv
    row_p = partial_ptr + g.to(tl.int64) * 2 * (K + PARTIAL_EXTRA)
    row_r = row_p + K + PARTIAL_EXTRA
    tl.store(row_p + col, tl.sum(acc_p, axis=0), mask=cm)
    tl.store(row_r + col, tl.sum(acc_r, axis=0), mask=cm)
    if j == 0:
        tl.store(row_p + K, tl.sum(bias_p, axis=0))
        tl.store(row_p + K + 1, tl.sum(amp_p, axis=0))
        tl.store(row_r + K, tl.sum(bias_r, axis=0))
        tl.store(row_r + K + 1, tl.sum(amp_r, axis=0))
