"""Look-back forward that reads each input once: the chunk staged in shared memory (Gluon).

The loop-inner look-back forward (:mod:`samu_tune.kernels.lookback`, LOOP) walks its chunk
twice, the summary and then the replay, and reads the chunk's inputs from memory both times:
at large B x M the chunks in flight outgrow L2 and the second read comes from DRAM (at
(8, 8192, 1024) on the H200, 813 MB moved for 537 needed: docs/performance.md).  Plain
Triton cannot keep a chunk between the two walks (registers cannot be indexed by row, and a
[CHUNK, BLOCK_M] register tile spills); Gluon's explicit shared memory can.

Programs are persistent: the host launches as many as fit on the device at once, and each
one walks chunk after chunk, taking a ticket for each (chunk slowest, as in the Triton
kernel) until the tickets run out.  Per chunk:

1. Its rows of br and bi are already on their way into shared memory [CHUNK, BLOCK_M]
   (cp.async, 16 bytes a thread, GROUPS = 2 commit groups of CHUNK / 2 rows), and its
   controls and spectrum in registers: the previous chunk's replay issued them (the first
   chunk's, the program's start).
2. It writes its rows of the control table (:mod:`samu_tune.kernels.controls`, as
   MAKE_TABLE does), which the backward reads, and the same rows into shared memory, which
   the walks read per row (read back from global memory instead, each walk step waited on
   them: at (8, 8192, 1024) on the H200, 29% of the cycles between a warp's instructions
   were long-scoreboard stalls; docs/performance.md).
3. Summary: P = prod A in closed form from the chunk's controls, e^(-nu sum e^eta)
   e^(i (n theta + sum delta)) (0 where a row resets; its phase rounded once at n theta +
   sum delta, not at every row), computed while the copies land; Q
   walked from shared memory as each group lands, Q <- A Q + u.  (A complex product per row
   for P cost 4 of the summary's 20 instructions per element.)
4. Publish, look back (decoupled, WIDTH predecessors per poll), publish the inclusive
   prefix: the protocol of :func:`samu_tune.kernels.lookback.lookback_scan` with the same
   head, slots and statuses, so the host's workspace and head bookkeeping serve both
   kernels.
5. Replay from shared memory: h = A h + u, every state stored in the output dtype; the last
   chunk writes the final state (fp32).  The next ticket is taken as the replay starts and
   read after its first group; each group's rows, once replayed, are refilled with the next
   chunk's.  So the ticket's round trip and the first rows' memory latency, which a program
   per chunk waited on before its summary could start, overlap this chunk's replay: at
   (8, 8192, 1024) on an H100, 0.2097 ms against 0.2207 for a program per chunk
   (docs/performance.md).

A program waits only on lower tickets (its look-back), and the lowest unfinished ticket is
always one a running program walks (a program holds at most its chunk's ticket and the next,
higher one), so any number of programs completes, however many run at once.  With fewer
programs than chunks each takes one ticket past the last and gives it back (an atomic
decrement), so the head's ticket count advances by the number of chunks, as for a program
per chunk; with as many, each walks its one chunk and takes no second ticket.

Rows walk UNROLL at a time (their loads issued together), the chunk's last n % UNROLL rows
one at a time.  bf16 rows are read as int32 words and unpacked by a shift (low half) and a
mask (high half) where a thread holds two or more modes: the compiler's conversion spends two
instructions on each high half.  M is a multiple of 8 (16-byte copies of bf16 rows); the host
checks it.
The ticket's decoding, the staging and the look-back protocol are
:mod:`samu_tune.kernels.lookback_once_parts`, shared with the backward.
Forward only.  The backward reads the table this kernel writes: the Triton loop walk
(strategy ``lookback_once``) or :mod:`samu_tune.kernels.lookback_once_backward`, which stages
d out the same way (strategy ``lookback_staged``).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from samu_tune.kernels.complex_math import cmul_add, transition_cs
from samu_tune.kernels.controls import TABLE_COLS
from samu_tune.kernels.lookback_once_parts import (as_rows, cta_barrier, decode_ticket,
                                                   publish_and_look_back, publish_prefix,
                                                   spectrum_of, stage_group)


@gluon.jit
def _unpack(w, ROW: gl.constexpr):
    """bf16 pairs packed in int32 words, [BLOCK_M / 2] -> fp32 [BLOCK_M] in ``ROW``: the low
    half by a shift, the high half by a mask (the pair's join and reshape move no data)."""
    lo = (w << 16).to(gl.float32, bitcast=True)
    hi = (w & -65536).to(gl.float32, bitcast=True)
    pair = gl.join(lo, hi)
    return gl.convert_layout(gl.reshape(pair, [pair.shape[0] * 2]), ROW)


@gluon.jit
def _rows(rows_r, rows_i, tab, r0, nu, cos_theta, sin_theta, ROW: gl.constexpr,
          HALF: gl.constexpr, PACKED: gl.constexpr, N: gl.constexpr):
    """Rows r0 .. r0 + N - 1 of the staged chunk, each (ar, ai, ur, ui), [BLOCK_M] fp32: A
    from the row's table entry in shared memory (``tab``: e^eta, cos delta, sin delta, each
    [CHUNK] rows of [1]; zero rotation on a reset), read as [1] in ``ROW`` (every thread
    holds it) and broadcast, u = br + i bi (``PACKED``: rows of int32 words, read in
    ``HALF`` and unpacked).  Every row's loads are issued before the first
    use of one (in program order, which ptxas keeps: the rows' latencies overlap instead of
    adding up)."""
    XL: gl.constexpr = HALF if PACKED else ROW      # a row's load layout
    loads = ()
    for u in gl.static_range(N):
        r = r0 + u
        loads = loads + ((tab[0].index(r).load(ROW), tab[1].index(r).load(ROW),
                          tab[2].index(r).load(ROW), rows_r.index(r).load(XL),
                          rows_i.index(r).load(XL)),)
    out = ()
    for u in gl.static_range(N):
        e, cd, sd, xr, xi = loads[u]
        ar, ai, _ = transition_cs(nu, cos_theta, sin_theta, e, cd, sd)
        if PACKED:
            out = out + ((ar, ai, _unpack(xr, ROW), _unpack(xi, ROW)),)
        else:
            out = out + ((ar, ai, xr.to(gl.float32), xi.to(gl.float32)),)
    return out


@gluon.jit
def _controls(eta_ptr, delta_ptr, seg_ptr, nu_log_ptr, theta_log_ptr, ticket, B, L, M, n_mtiles,
              n_chunks, CHUNK: gl.constexpr, BLOCK_M: gl.constexpr, HAS_RESETS: gl.constexpr,
              TAB: gl.constexpr, ROW: gl.constexpr):
    """A ticket's loads other than its rows, issued a chunk ahead of their use: eta, delta and
    whether the row keeps its state (each [CHUNK] along dim 0 of ``TAB``), nu_log and
    theta_log of its mode tile ([BLOCK_M] in ``ROW``), fp32; zeros past the last ticket."""
    c, b, mt, slot, start, n = decode_ticket(ticket, B, L, n_mtiles, n_chunks, CHUNK)
    k = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, TAB))
    ok = k < n
    tok = b.to(gl.int64) * L + start + k
    eta = gl.load(eta_ptr + tok, mask=ok, other=0.0).to(gl.float32)
    delta = gl.load(delta_ptr + tok, mask=ok, other=0.0).to(gl.float32)
    if HAS_RESETS:
        keep = gl.load(seg_ptr + tok, mask=ok, other=1) != 0
    else:
        keep = k >= 0
    lane = mt * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW)
    lane_ok = (lane < M) & (n > 0)
    nu_log = gl.load(nu_log_ptr + lane, mask=lane_ok, other=0.0).to(gl.float32)
    theta_log = gl.load(theta_log_ptr + lane, mask=lane_ok, other=0.0).to(gl.float32)
    return eta, delta, keep, nu_log, theta_log


@gluon.jit
def _stage(xs_r, xs_i, x_r_ptr, x_i_ptr, ticket, g: gl.constexpr, B, L, M, n_mtiles, n_chunks,
           CHUNK: gl.constexpr, BLOCK_M: gl.constexpr, GROUPS: gl.constexpr,
           VEC: gl.constexpr, COPY_COLS: gl.constexpr):
    """Commit group ``g`` of a ticket's rows of br, bi into ``xs_*`` (none past the last
    ticket: an empty group)."""
    c, b, mt, slot, start, n = decode_ticket(ticket, B, L, n_mtiles, n_chunks, CHUNK)
    tok0 = b.to(gl.int64) * L + start
    stage_group(xs_r, xs_i, x_r_ptr + tok0 * M, x_i_ptr + tok0 * M, n, mt, M, g, CHUNK,
                BLOCK_M, GROUPS, VEC, COPY_COLS, False)


@gluon.jit
def _replay(rows_r, rows_i, tab, lo, hi_rows, hr, hi, nu, cos_theta, sin_theta, y_r_c, y_i_c,
            lane, lane_ok, M, ROW: gl.constexpr, HALF: gl.constexpr, PACKED: gl.constexpr,
            UNROLL: gl.constexpr):
    """Rows lo .. hi_rows - 1 of the staged chunk (``lo`` a multiple of UNROLL): h = A h + u,
    every state stored in the output dtype, UNROLL rows a step, then the last rows one at a
    time.  Returns the state after them."""
    full = lo + (hi_rows - lo) // UNROLL * UNROLL
    for r0 in range(lo, full, UNROLL):
        block = _rows(rows_r, rows_i, tab, r0, nu, cos_theta, sin_theta, ROW, HALF, PACKED,
                      UNROLL)
        for u in gl.static_range(UNROLL):
            ar, ai, ur, ui = block[u]
            hr, hi = cmul_add(ar, ai, hr, hi, ur, ui)
            gl.store(y_r_c + (r0 + u) * M + lane, hr.to(y_r_c.dtype.element_ty), mask=lane_ok)
            gl.store(y_i_c + (r0 + u) * M + lane, hi.to(y_i_c.dtype.element_ty), mask=lane_ok)
    for r in range(full, hi_rows):
        ar, ai, ur, ui = _rows(rows_r, rows_i, tab, r, nu, cos_theta, sin_theta, ROW, HALF,
                               PACKED, 1)[0]
        hr, hi = cmul_add(ar, ai, hr, hi, ur, ui)
        gl.store(y_r_c + r * M + lane, hr.to(y_r_c.dtype.element_ty), mask=lane_ok)
        gl.store(y_i_c + r * M + lane, hi.to(y_i_c.dtype.element_ty), mask=lane_ok)
    return hr, hi


@gluon.jit(do_not_specialize=["B", "L", "M", "n_mtiles", "n_chunks", "ticket0", "status0"])
def lookback_once_forward(
    sync_ptr,                    # [1 + n_slots] int32: ticket counter, then statuses
    carry_ptr,                   # [n_slots, SLOT_ROWS, BLOCK_M] f32 published summaries
    eta_ptr, delta_ptr,          # [B, L] controls (f32 / bf16)
    nu_log_ptr, theta_log_ptr,   # [M] spectrum (f32)
    seg_ptr,                     # [B, L] int segment positions (HAS_RESETS)
    ctl_ptr,                     # [B L, 4] f32 control table (written here)
    x_r_ptr, x_i_ptr,            # br, bi [B, L, M]
    h0_r_ptr, h0_i_ptr,          # [B, M] initial state (HAS_H0)
    y_r_ptr, y_i_ptr,            # out (written) [B, L, M]
    end_r_ptr, end_i_ptr,        # final state (written) [B, M] f32
    B, L, M, n_mtiles, n_chunks, ticket0, status0,
    HAS_RESETS: gl.constexpr, HAS_H0: gl.constexpr, CHUNK: gl.constexpr,
    BLOCK_M: gl.constexpr, GROUPS: gl.constexpr, UNROLL: gl.constexpr, VEC: gl.constexpr,
    COPY_COLS: gl.constexpr, WIDTH: gl.constexpr,
):
    """Grid: (programs,), any number from 1 (the host launches as many as fit on the device
    at once, at most the B * n_mtiles * n_chunks chunks); with fewer programs than chunks each
    takes tickets until one is past the last, and gives that one back; with as many, each
    walks the chunk of its one ticket.  VEC: elements per 16-byte copy; COPY_COLS: threads of
    a warp along a row in the copy (min(32, BLOCK_M / VEC)); WIDTH: predecessors read per
    look-back poll.  The head needs no zero fill between launches (``ticket0``, ``status0``:
    as in :func:`samu_tune.kernels.lookback.lookback_scan`)."""
    NW: gl.constexpr = gl.num_warps()
    ROW: gl.constexpr = gl.BlockedLayout([BLOCK_M // (32 * NW)], [32], [NW], [0])
    # a row of int32 words (``PACKED``)
    HALF: gl.constexpr = gl.BlockedLayout([max(BLOCK_M // (64 * NW), 1)], [32], [NW], [0])
    TOK: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    # tokens along dim 0 of [CHUNK, 1] (the shared table's shape)
    TAB: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    # a staged buffer seen as CHUNK rows of [BLOCK_M] (a row read is ``.index(r)``)
    SMEM_ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    GR: gl.constexpr = CHUNK // GROUPS
    gl.static_assert(GROUPS == 2, "the replay refills the chunk in two commit groups")

    M = M // 8 * 8                            # rows of 16-byte aligned copies (host-checked)
    total = B * n_mtiles * n_chunks
    xs_r = gl.allocate_shared_memory(x_r_ptr.dtype.element_ty, [CHUNK, BLOCK_M], SMEM)
    xs_i = gl.allocate_shared_memory(x_i_ptr.dtype.element_ty, [CHUNK, BLOCK_M], SMEM)
    # bf16 rows read as int32 words (two values each) where a thread holds two or more modes
    PACKED: gl.constexpr = (x_r_ptr.dtype.element_ty == gl.bfloat16) & (BLOCK_M >= 64 * NW)
    if PACKED:
        rows_r = as_rows(xs_r, gl.int32, CHUNK, BLOCK_M // 2, SMEM_ROWS)
        rows_i = as_rows(xs_i, gl.int32, CHUNK, BLOCK_M // 2, SMEM_ROWS)
    else:
        rows_r = as_rows(xs_r, xs_r.dtype, CHUNK, BLOCK_M, SMEM_ROWS)
        rows_i = as_rows(xs_i, xs_i.dtype, CHUNK, BLOCK_M, SMEM_ROWS)
    tab_e = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM)
    tab_c = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM)
    tab_s = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM)
    tab = (as_rows(tab_e, gl.float32, CHUNK, 1, SMEM_ROWS),
           as_rows(tab_c, gl.float32, CHUNK, 1, SMEM_ROWS),
           as_rows(tab_s, gl.float32, CHUNK, 1, SMEM_ROWS))
    tk_lane = gl.arange(0, 32 * NW, layout=TOK)
    opaque_zero = n_chunks // (n_chunks + 1)
    k = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, TAB))
    lane_t = gl.arange(0, BLOCK_M, layout=ROW)

    # 1. the first ticket's rows into shared memory, its controls into registers
    ticket = gl.atomic_add(sync_ptr, 1, sem="relaxed") - ticket0
    # more tickets than programs: each program walks chunks until a ticket past the last,
    # which it gives back; else each walks its one chunk (no second ticket, no refill)
    more = total > gl.num_programs(0)
    give_back = more | (ticket >= total)
    for g in gl.static_range(GROUPS):
        _stage(xs_r, xs_i, x_r_ptr, x_i_ptr, ticket, g, B, L, M, n_mtiles, n_chunks, CHUNK,
               BLOCK_M, GROUPS, VEC, COPY_COLS)
    eta, delta, keep, nu_log, theta_log = _controls(
        eta_ptr, delta_ptr, seg_ptr, nu_log_ptr, theta_log_ptr, ticket, B, L, M, n_mtiles,
        n_chunks, CHUNK, BLOCK_M, HAS_RESETS, TAB, ROW)
    while ticket < total:
        c, b, mt, slot, start, n = decode_ticket(ticket, B, L, n_mtiles, n_chunks, CHUNK)
        tok0 = b.to(gl.int64) * L + start     # the chunk's first token (int64)
        ok = k < n
        tok = tok0 + k

        # 2. the chunk's control table rows (every mode tile of the chunk writes the same
        # values), and the same rows into shared memory for the walks (visible to every thread
        # after the summary's first CTA barrier; the last chunk's readers are past the CTA
        # barrier before its second refill)
        cd = gl.cos(delta)
        sd = gl.sin(delta)
        if HAS_RESETS:
            cd = gl.where(keep, cd, 0.0)
            sd = gl.where(keep, sd, 0.0)
        e_eta = gl.exp(eta)
        trow = ctl_ptr + tok * TABLE_COLS
        gl.store(trow, e_eta, mask=ok)
        gl.store(trow + 1, cd, mask=ok)
        gl.store(trow + 2, sd, mask=ok)
        gl.store(trow + 3, gl.zeros_like(cd), mask=ok)
        tab_e.store(gl.expand_dims(e_eta, 1))
        tab_c.store(gl.expand_dims(cd, 1))
        tab_s.store(gl.expand_dims(sd, 1))

        lane = mt * BLOCK_M + lane_t
        lane_ok = lane < M
        nu, theta, cos_theta, sin_theta = spectrum_of(nu_log, theta_log)

        # P = prod A = e^(-nu sum e^eta) e^(i (n theta + sum delta)), 0 where a row resets,
        # while the copies land
        s_eta = gl.sum(gl.where(ok, e_eta, 0.0), axis=0)
        s_delta = gl.sum(gl.where(ok, delta, 0.0), axis=0)
        p_rad = gl.exp2((nu * -1.4426950408889634) * s_eta)
        if HAS_RESETS:
            resets = gl.sum(gl.where(keep, 0, 1), axis=0)     # rows past n keep (other=1)
            p_rad = gl.where(resets > 0, 0.0, p_rad)
        ang = n.to(gl.float32) * theta + s_delta
        pr = p_rad * gl.cos(ang)
        pi = p_rad * gl.sin(ang)
        # 3. summary: the chunk's map z -> P z + Q, Q from its staged rows, each group as it
        # lands
        qr = gl.zeros_like(nu)
        qi = gl.zeros_like(nu)
        blocks = n // UNROLL
        for g in gl.static_range(GROUPS):
            async_copy.wait_group(GROUPS - 1 - g)
            cta_barrier()                   # other threads' copies (and the table rows)
            first = g * (GR // UNROLL)
            for rb in range(first, gl.minimum(blocks, first + GR // UNROLL)):
                block = _rows(rows_r, rows_i, tab, rb * UNROLL, nu, cos_theta, sin_theta, ROW,
                              HALF, PACKED, UNROLL)
                for u in gl.static_range(UNROLL):
                    ar, ai, ur, ui = block[u]
                    qr, qi = cmul_add(ar, ai, qr, qi, ur, ui)
        for r in range(blocks * UNROLL, n):
            ar, ai, ur, ui = _rows(rows_r, rows_i, tab, r, nu, cos_theta, sin_theta, ROW, HALF,
                                   PACKED, 1)[0]
            qr, qi = cmul_add(ar, ai, qr, qi, ur, ui)

        # 4. publish the aggregate, look back, publish the inclusive prefix
        state_off = b.to(gl.int64) * M + lane
        if HAS_H0:
            first_lanes = lane_ok & (c == 0)
            init_r = gl.load(h0_r_ptr + state_off, mask=first_lanes, other=0.0).to(gl.float32)
            init_i = gl.load(h0_i_ptr + state_off, mask=first_lanes, other=0.0).to(gl.float32)
        else:
            init_r = gl.zeros_like(nu)
            init_i = gl.zeros_like(nu)
        hr, hi, base = publish_and_look_back(sync_ptr, carry_ptr, slot, c, lane_t, pr, pi, qr,
                                              qi, init_r, init_i, status0, BLOCK_M, WIDTH, TOK)
        end_r, end_i = cmul_add(pr, pi, hr, hi, qr, qi)
        publish_prefix(sync_ptr, base, slot, end_r, end_i, status0, BLOCK_M)

        # 5. the next ticket, taken by one thread and read after the first group's replay (a
        # round trip hidden); per-lane addresses (every one the counter: ``opaque_zero`` is
        # 0) keep ptxas from aggregating the atomic over the warp, which reads its answer at
        # once
        taken = gl.atomic_add(sync_ptr + tk_lane * opaque_zero, tk_lane * 0 + 1,
                              mask=(tk_lane == 0) & more, sem="relaxed")
        # 6. replay from shared memory, every state in the output dtype; each group's rows,
        # once replayed, are refilled with the next ticket's, whose copies land while this
        # chunk's second group and the next summary's table run
        y_r_c = y_r_ptr + tok0 * M
        y_i_c = y_i_ptr + tok0 * M
        hr, hi = _replay(rows_r, rows_i, tab, 0, gl.minimum(n, GR), hr, hi, nu, cos_theta,
                         sin_theta, y_r_c, y_i_c, lane, lane_ok, M, ROW, HALF, PACKED, UNROLL)
        if more:
            ticket = gl.max(gl.where(tk_lane == 0, taken, -2147483647), axis=0) - ticket0
            cta_barrier()                   # every thread past the first group's rows
            _stage(xs_r, xs_i, x_r_ptr, x_i_ptr, ticket, 0, B, L, M, n_mtiles, n_chunks,
                   CHUNK, BLOCK_M, GROUPS, VEC, COPY_COLS)
            eta, delta, keep, nu_log, theta_log = _controls(
                eta_ptr, delta_ptr, seg_ptr, nu_log_ptr, theta_log_ptr, ticket, B, L, M,
                n_mtiles, n_chunks, CHUNK, BLOCK_M, HAS_RESETS, TAB, ROW)
        else:
            ticket = total
        hr, hi = _replay(rows_r, rows_i, tab, GR, n, hr, hi, nu, cos_theta, sin_theta, y_r_c,
                         y_i_c, lane, lane_ok, M, ROW, HALF, PACKED, UNROLL)
        last = lane_ok & (c == n_chunks - 1)
        gl.store(end_r_ptr + state_off, end_r, mask=last)
        gl.store(end_i_ptr + state_off, end_i, mask=last)
        if more:
            cta_barrier()                   # every thread past the chunk's rows and table
            _stage(xs_r, xs_i, x_r_ptr, x_i_ptr, ticket, 1, B, L, M, n_mtiles, n_chunks,
                   CHUNK, BLOCK_M, GROUPS, VEC, COPY_COLS)
    # a ticket past the last, given back: the head's count advances by the chunks
    if give_back:
        gl.atomic_add(sync_ptr, -1, sem="relaxed")
