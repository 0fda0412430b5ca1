"""Look-back backward that reads d out once: the chunk staged in shared memory (Gluon).

The adjoint of :mod:`samu_tune.kernels.lookback_once`'s forward, time walked from L - 1 down
(chunk c holds times L - 1 - c CHUNK down to L - c CHUNK - n; its row r is time
t = L - 1 - c CHUNK - r):

    g[t] = conj(A[t+1]) g[t+1] + dout[t]      (g[L-1] = dout[L-1] + d final state)
    grad b[t] = g[t];  dL/dA[t] = g[t] conj(h[t-1])  (h[-1] = h0 or 0)
    d eta[t] = sum over modes of log|A[t]| Re(conj(dL/dA) A[t]),
    d delta[t] = sum over modes of Im(conj(dL/dA) A[t]);  grad h0 = conj(A[0]) g[0]

1. The program copies its chunk's rows of d out into shared memory [CHUNK, BLOCK_M] (row r
   = time t, cp.async in GROUPS commit groups) and its rows of the control table (written by
   the forward) into three [CHUNK, 1] buffers.
2. Summary: the chunk's map z -> P z + Q of the steps g <- conj(A[t+1]) g + dout[t] from the
   staged rows; A[t+1] of row 0 is the next chunk's first token (identity at t = L - 1).
3. Publish, look back, publish the inclusive prefix (the forward's helpers: the same head,
   slots and statuses): the adjoint entering the chunk.
4. Replay: g row by row from shared memory, h[t-1] read from the saved outputs, grad b
   stored in the output dtype.  Rows walk UNROLL at a time and each block's h[t-1] loads go
   out one block ahead, so their latency hides behind a block's work (at (8, 8192, 1024) on
   an H100, training 0.557 ms against 0.603 with the loads issued at the top of their own
   block; docs/performance.md).  The per-token control sums
   are summed per warp (registers, then shuffles) and float-atomically added into [B, L]
   by one lane of each warp (no CTA barrier per row); the spectrum sums ([BLOCK_M] per
   program) into [M] after the walk.

Decoupled look-back only (float atomics: the sum order varies from run to run); M a multiple
of 8 (16-byte row copies), as the forward.  Lanes past M hold g = 0 and h = 0 (the copy's
masked elements arrive as zeros, the loads' masked ones read 0), so their gradients add 0 to
the per-token sums without a select (checked on an H100 at M = 264 and 1032 against float64).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from samu_tune.kernels.complex_math import cmul_conj, cmul_conj_add, transition_cs
from samu_tune.kernels.controls import TABLE_COLS
from samu_tune.kernels.lookback_once_parts import (as_rows, cta_barrier, publish_and_look_back,
                                                   publish_prefix, spectrum, stage_rows,
                                                   stage_table, ticket_chunk)


@gluon.jit
def _tab_rows(tab, r0, ROW: gl.constexpr, N: gl.constexpr):
    """Rows r0 .. r0 + N - 1 of the staged control table: (e^eta, cos delta, sin delta) each
    [1] in ``ROW`` (every thread holds it, broadcast on use)."""
    out = ()
    for u in gl.static_range(N):
        out = out + ((tab[0].index(r0 + u).load(ROW), tab[1].index(r0 + u).load(ROW),
                      tab[2].index(r0 + u).load(ROW)),)
    return out


@gluon.jit
def _add_warp_sums(ptr, x, NW: gl.constexpr, PER: gl.constexpr):
    """Add the sum of [BLOCK_M] ``x`` into the scalar at ``ptr``: each warp sums its modes
    (registers, then shuffles) and adds its sum atomically (one lane per warp; no CTA
    barrier)."""
    s = gl.sum(gl.reshape(x, [NW, 32 * PER]), axis=1)                 # [NW], one per warp
    gl.atomic_add(ptr + gl.zeros_like(s).to(gl.int32), s, sem="relaxed")


@gluon.jit
def _replay_loads(rows_r, rows_i, y_r_c, y_i_c, r, t_top, M, lane, lane_ok, lane_zero,
                  ROW: gl.constexpr):
    """Row r's d out (shared memory) and h[t-1] (the saved outputs, at ``y_*_c`` - r M + lane;
    0 at t = 0), unconverted."""
    has_prev = lane_ok & ((lane_zero + (t_top - r)) > 0)
    return (rows_r.index(r).load(ROW), rows_i.index(r).load(ROW),
            gl.load(y_r_c + (-r * M) + lane, mask=has_prev, other=0.0),
            gl.load(y_i_c + (-r * M) + lane, mask=has_prev, other=0.0))


@gluon.jit
def _h_block(y_r_c, y_i_c, r0, t_top, n, M, lane, lane_ok, lane_zero, N: gl.constexpr):
    """h[t-1] of rows r0 .. r0 + N - 1 (pairs from the saved outputs, at ``y_*_c`` - r M +
    lane, unconverted; 0 at t = 0 and for rows past the chunk's n, so the block after the
    last one loads nothing)."""
    out = ()
    for u in gl.static_range(N):
        r = r0 + u
        ok = lane_ok & ((lane_zero + (t_top - r)) > 0) & ((lane_zero + r) < n)
        out = out + ((gl.load(y_r_c + (-r * M) + lane, mask=ok, other=0.0),
                      gl.load(y_i_c + (-r * M) + lane, mask=ok, other=0.0)),)
    return out


@gluon.jit
def _replay_row(ctl, loads, r, t_top, gr, gi, nr, ni, acc_nu, acc_delta, nu, cos_theta,
                sin_theta, h0r, h0i, gx_r_c, gx_i_c, M, lane, lane_ok, lane_zero, g_eta_c, g_delta_c,
                HAS_H0: gl.constexpr, NW: gl.constexpr, PER: gl.constexpr):
    """Row r (time t = t_top - r) of the replay: g[t] = conj(A[t+1]) g + dout[t] ((nr, ni):
    A[t+1]), grad b[t] = g[t] stored, the row's gradients of A: per lane into (acc_nu,
    acc_delta), per token added into ``g_eta_c``, ``g_delta_c`` (row 0's token) - r.
    Returns (gr, gi, A[t], acc_nu, acc_delta)."""
    e, cd, sd = ctl
    xr, xi, hr, hi = loads
    ar, ai, log_radius = transition_cs(nu, cos_theta, sin_theta, e, cd, sd)
    gr, gi = cmul_conj_add(nr, ni, gr, gi, xr.to(gl.float32), xi.to(gl.float32))
    gl.store(gx_r_c + (-r * M) + lane, gr.to(gx_r_c.dtype.element_ty), mask=lane_ok)
    gl.store(gx_i_c + (-r * M) + lane, gi.to(gx_i_c.dtype.element_ty), mask=lane_ok)
    hr = hr.to(gl.float32)
    hi = hi.to(gl.float32)
    if HAS_H0:
        at_zero = (lane_zero + (t_top - r)) == 0
        hr = gl.where(at_zero, h0r, hr)
        hi = gl.where(at_zero, h0i, hi)
    # dL/dA = g conj(h[t-1]); lanes past M hold g = 0 and h = 0
    dar = gr * hr + gi * hi
    dai = gi * hr - gr * hi
    d_eta = log_radius * (dar * ar + dai * ai)
    d_delta = dai * ar - dar * ai
    _add_warp_sums(g_eta_c - r, d_eta, NW, PER)
    _add_warp_sums(g_delta_c - r, d_delta, NW, PER)
    return gr, gi, ar, ai, acc_nu + d_eta, acc_delta + d_delta


@gluon.jit(do_not_specialize=["B", "L", "M", "n_mtiles", "n_chunks", "ticket0", "status0"])
def lookback_once_backward(
    sync_ptr,                    # [1 + n_slots] int32: ticket counter, then statuses
    carry_ptr,                   # [n_slots, SLOT_ROWS, BLOCK_M] f32 published summaries
    ctl_ptr,                     # [B L, 4] f32 control table (the forward's)
    nu_log_ptr, theta_log_ptr,   # [M] spectrum (f32)
    x_r_ptr, x_i_ptr,            # d out [B, L, M]
    h0_r_ptr, h0_i_ptr,          # [B, M] initial state (HAS_H0)
    y_r_ptr, y_i_ptr,            # the forward's outputs h [B, L, M]
    end_r_ptr, end_i_ptr,        # d final state [B, M] f32 (HAS_END)
    gx_r_ptr, gx_i_ptr,          # grad br, bi (written) [B, L, M]
    gh0_r_ptr, gh0_i_ptr,        # grad h0 (written, HAS_H0) [B, M] f32
    g_eta_ptr, g_delta_ptr,      # grad eta, delta sums [B, L] f32 (zeroed)
    g_nu_ptr, g_theta_ptr,       # grad nu_log, theta_log sums [M] f32 (zeroed)
    B, L, M, n_mtiles, n_chunks, ticket0, status0,
    HAS_H0: gl.constexpr, HAS_END: gl.constexpr, CHUNK: gl.constexpr,
    BLOCK_M: gl.constexpr, GROUPS: gl.constexpr, UNROLL: gl.constexpr, VEC: gl.constexpr,
    COPY_COLS: gl.constexpr, WIDTH: gl.constexpr,
):
    """Grid: (B * n_mtiles * n_chunks,); the program id is ignored in favour of the ticket
    (chunks in reversed time order).  VEC, COPY_COLS, WIDTH: as the forward's."""
    NW: gl.constexpr = gl.num_warps()
    NT: gl.constexpr = 32 * NW
    PER: gl.constexpr = BLOCK_M // NT
    ROW: gl.constexpr = gl.BlockedLayout([PER], [32], [NW], [0])
    TOK: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    SMEM_ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    GR: gl.constexpr = CHUNK // GROUPS

    M = M // 8 * 8                            # rows of 16-byte aligned copies (host-checked)
    c, b, mt, slot, start, n = ticket_chunk(sync_ptr, ticket0, B, L, n_mtiles, n_chunks,
                                             CHUNK)
    t_top = L - 1 - start                     # the time of row 0
    tok_top = b.to(gl.int64) * L + t_top      # its token (int64); row r is tok_top - r

    # 1. d out's rows into shared memory (row r: time t_top - r), GROUPS commit groups
    xs_r, xs_i = stage_rows(x_r_ptr + tok_top * M, x_i_ptr + tok_top * M, n, mt, M, CHUNK,
                             BLOCK_M, GROUPS, VEC, COPY_COLS, True)
    rows_r = as_rows(xs_r, xs_r.dtype, CHUNK, BLOCK_M, SMEM_ROWS)
    rows_i = as_rows(xs_i, xs_i.dtype, CHUNK, BLOCK_M, SMEM_ROWS)

    # the chunk's control table rows (the forward's table) into shared memory
    TAB: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    k = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, TAB))
    ok = k < n
    trow = ctl_ptr + (tok_top - k) * TABLE_COLS
    tab = stage_table(gl.load(trow, mask=ok, other=0.0), gl.load(trow + 1, mask=ok, other=0.0),
                       gl.load(trow + 2, mask=ok, other=0.0), CHUNK)
    lane_t = gl.arange(0, BLOCK_M, layout=ROW)
    lane = mt * BLOCK_M + lane_t
    lane_ok = lane < M
    nu, theta, cos_theta, sin_theta = spectrum(nu_log_ptr, theta_log_ptr, lane, lane_ok)

    # A[t_top + 1]: the next chunk's first token; the identity at t_top = L - 1
    lane_zero = lane_t * 0
    has_next = (lane_zero + start) > 0
    nxt = ctl_ptr + (tok_top + 1) * TABLE_COLS + lane_zero
    n0r, n0i, _ = transition_cs(nu, cos_theta, sin_theta,
                                gl.load(nxt, mask=has_next, other=0.0),
                                gl.load(nxt + 1, mask=has_next, other=0.0),
                                gl.load(nxt + 2, mask=has_next, other=0.0))
    n0r = gl.where(has_next, n0r, 1.0)
    n0i = gl.where(has_next, n0i, 0.0)

    # 2. summary: (P, Q) <- (conj(A[t+1]) P, conj(A[t+1]) Q + dout[t]) over the chunk's rows
    pr = gl.full_like(nu, 1.0)
    pi = gl.zeros_like(nu)
    qr = gl.zeros_like(nu)
    qi = gl.zeros_like(nu)
    nr = n0r
    ni = n0i
    blocks = n // UNROLL
    for g in gl.static_range(GROUPS):
        async_copy.wait_group(GROUPS - 1 - g)
        cta_barrier()                   # other threads' copies (and the table rows)
        first = g * (GR // UNROLL)
        for rb in range(first, gl.minimum(blocks, first + GR // UNROLL)):
            r0 = rb * UNROLL
            ts = _tab_rows(tab, r0, ROW, UNROLL)
            xs = ()
            for u in gl.static_range(UNROLL):
                xs = xs + ((rows_r.index(r0 + u).load(ROW), rows_i.index(r0 + u).load(ROW)),)
            for u in gl.static_range(UNROLL):
                e, cd, sd = ts[u]
                xr, xi = xs[u]
                pr, pi = cmul_conj(nr, ni, pr, pi)
                qr, qi = cmul_conj_add(nr, ni, qr, qi, xr.to(gl.float32), xi.to(gl.float32))
                nr, ni, _ = transition_cs(nu, cos_theta, sin_theta, e, cd, sd)
    for r in range(blocks * UNROLL, n):
        e, cd, sd = _tab_rows(tab, r, ROW, 1)[0]
        xr = rows_r.index(r).load(ROW).to(gl.float32)
        xi = rows_i.index(r).load(ROW).to(gl.float32)
        pr, pi = cmul_conj(nr, ni, pr, pi)
        qr, qi = cmul_conj_add(nr, ni, qr, qi, xr, xi)
        nr, ni, _ = transition_cs(nu, cos_theta, sin_theta, e, cd, sd)

    # 3. publish the aggregate, look back, publish the inclusive prefix
    state_off = b.to(gl.int64) * M + lane
    if HAS_END:
        first_lanes = lane_ok & (c == 0)
        init_r = gl.load(end_r_ptr + state_off, mask=first_lanes, other=0.0)
        init_i = gl.load(end_i_ptr + state_off, mask=first_lanes, other=0.0)
    else:
        init_r = gl.zeros_like(nu)
        init_i = gl.zeros_like(nu)
    gr, gi, base = publish_and_look_back(sync_ptr, carry_ptr, slot, c, lane_t, pr, pi, qr, qi,
                                          init_r, init_i, status0, BLOCK_M, WIDTH, TOK)
    publish_prefix(sync_ptr, base, slot, (pr * gr - pi * gi) + qr, (pr * gi + pi * gr) + qi,
                    status0, BLOCK_M)

    # 4. replay: g, grad b, the gradients of A
    if HAS_H0:
        h0r = gl.load(h0_r_ptr + state_off, mask=lane_ok, other=0.0).to(gl.float32)
        h0i = gl.load(h0_i_ptr + state_off, mask=lane_ok, other=0.0).to(gl.float32)
    else:
        h0r = nu                              # unused
        h0i = nu
    acc_nu = gl.zeros_like(nu)
    acc_delta = gl.zeros_like(nu)
    nr = n0r
    ni = n0i
    gx_r_c = gx_r_ptr + tok_top * M
    gx_i_c = gx_i_ptr + tok_top * M
    # h[t-1] of row r is token tok_top - r - 1
    y_r_c = y_r_ptr + (tok_top - 1) * M
    y_i_c = y_i_ptr + (tok_top - 1) * M
    g_eta_c = g_eta_ptr + tok_top
    g_delta_c = g_delta_ptr + tok_top
    hs = _h_block(y_r_c, y_i_c, 0, t_top, n, M, lane, lane_ok, lane_zero, UNROLL)
    for rb in range(0, blocks):
        r0 = rb * UNROLL
        ahead = _h_block(y_r_c, y_i_c, r0 + UNROLL, t_top, n, M, lane, lane_ok, lane_zero,
                         UNROLL)
        ts = _tab_rows(tab, r0, ROW, UNROLL)
        xs = ()
        for u in gl.static_range(UNROLL):
            xs = xs + ((rows_r.index(r0 + u).load(ROW), rows_i.index(r0 + u).load(ROW)),)
        for u in gl.static_range(UNROLL):
            gr, gi, nr, ni, acc_nu, acc_delta = _replay_row(
                ts[u], (xs[u][0], xs[u][1], hs[u][0], hs[u][1]), r0 + u, t_top, gr, gi, nr,
                ni, acc_nu, acc_delta, nu, cos_theta, sin_theta, h0r, h0i, gx_r_c, gx_i_c, M,
                lane, lane_ok, lane_zero, g_eta_c, g_delta_c, HAS_H0, NW, PER)
        hs = ahead
    for r in range(blocks * UNROLL, n):
        gr, gi, nr, ni, acc_nu, acc_delta = _replay_row(
            _tab_rows(tab, r, ROW, 1)[0],
            _replay_loads(rows_r, rows_i, y_r_c, y_i_c, r, t_top, M, lane, lane_ok, lane_zero,
                          ROW),
            r, t_top, gr, gi, nr, ni, acc_nu, acc_delta, nu, cos_theta, sin_theta, h0r, h0i,
            gx_r_c, gx_i_c, M, lane, lane_ok, lane_zero, g_eta_c, g_delta_c, HAS_H0, NW,
            PER)
    if HAS_H0:
        if start + n == L:
            # the chunk ends at t = 0: grad h0 = conj(A[0]) g[0]
            g0r, g0i = cmul_conj(nr, ni, gr, gi)
            gl.store(gh0_r_ptr + state_off, g0r, mask=lane_ok)
            gl.store(gh0_i_ptr + state_off, g0i, mask=lane_ok)

    # the spectrum's sums
    gl.atomic_add(g_nu_ptr + lane, acc_nu, mask=lane_ok, sem="relaxed")
    gl.atomic_add(g_theta_ptr + lane, acc_delta * theta, mask=lane_ok, sem="relaxed")
