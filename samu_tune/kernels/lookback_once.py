"""Look-back forward that reads each input once: the chunk staged in shared memory (Gluon).

The loop-inner look-back forward (:mod:`samu_tune.kernels.lookback`, LOOP) walks its chunk
twice, the summary and then the replay, and reads the chunk's inputs from memory both times:
at large B x M the chunks in flight outgrow L2 and the second read comes from DRAM (at
(8, 8192, 1024) on the H200, 813 MB moved for 537 needed: docs/performance.md).  Plain
Triton cannot keep a chunk between the two walks (registers cannot be indexed by row, and a
[CHUNK, BLOCK_M] register tile spills); Gluon's explicit shared memory can:

1. The program takes its ticket (chunk slowest, as in the Triton kernel) and issues
   asynchronous copies (cp.async, 16 bytes a thread) of its chunk's rows of br and bi into
   shared memory [CHUNK, BLOCK_M], in GROUPS commit groups of CHUNK / GROUPS rows.
2. It writes its chunk's rows of the control table (:mod:`samu_tune.kernels.controls`,
   as MAKE_TABLE does), which the backward reads, and the same rows into shared memory,
   which the walks read per row (read back from global memory instead, each walk step
   waited on them: at (8, 8192, 1024) on the H200, 29% of the cycles between a warp's
   instructions were long-scoreboard stalls; docs/performance.md).
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
   chunk writes the final state (fp32).

Rows walk UNROLL at a time (their loads issued together), the chunk's last n % UNROLL rows
one at a time.  bf16 rows are read as int32 words and unpacked by a shift (low half) and a
mask (high half) where a thread holds two or more modes: the compiler's conversion spends two
instructions on each high half.  M is a multiple of 8 (16-byte copies of bf16 rows); the host
checks it.
Forward only.  The backward reads the table this kernel writes: the Triton loop walk
(strategy ``lookback_once``) or :mod:`samu_tune.kernels.lookback_once_backward`, which stages
d out the same way (strategy ``lookback_staged``).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from samu_tune.kernels.complex_math import cmul, cmul_add, transition_cs
from samu_tune.kernels.controls import TABLE_COLS
from samu_tune.kernels.lookback import SLOT_ROWS, _publish, _status

# names that changed after Triton 3.6: cp.async global -> shared (``async_load``), the CTA
# barrier (``barrier``) and a shared buffer seen with another shape or layout
# (``reinterpret``)
_copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _as_rows(buf, DTYPE: gl.constexpr, CHUNK: gl.constexpr, W: gl.constexpr,
             LAYOUT: gl.constexpr):
    """``buf`` seen as CHUNK rows of [W] ``DTYPE`` (``.index(r)`` a row): its own rows, or a
    bf16 buffer's rows as int32 words (W half its width)."""
    if _NEW_REINTERPRET:
        rows = buf.reinterpret(DTYPE, [CHUNK, W], LAYOUT)
    else:
        rows = buf._reinterpret(DTYPE, [CHUNK, W], LAYOUT)
    return rows


@gluon.jit
def _ticket_chunk(sync_ptr, ticket0, B, L, n_mtiles, n_chunks, CHUNK: gl.constexpr):
    """The program's work from its ticket, chunk slowest (``ticket0``: the head's base, as in
    :func:`samu_tune.kernels.lookback.lookback_scan`): (b, mode tile mt, slot, the chunk's
    first step ``start`` in walk order, its rows n).  Relaxed: the ticket only orders work;
    payloads are ordered by the status atomics."""
    ticket = gl.atomic_add(sync_ptr, 1, sem="relaxed") - ticket0
    per_chunk = B * n_mtiles
    c = ticket // per_chunk
    rest = ticket % per_chunk
    b = rest // n_mtiles
    mt = rest % n_mtiles
    slot = (b * n_mtiles + mt) * n_chunks + c
    start = c * CHUNK
    n = gl.minimum(L - start, CHUNK)          # rows of this chunk
    return c, b, mt, slot, start, n


@gluon.jit
def _stage_rows(x_r_c, x_i_c, n, mt, M, CHUNK: gl.constexpr, BLOCK_M: gl.constexpr,
                GROUPS: gl.constexpr, VEC: gl.constexpr, COPY_COLS: gl.constexpr,
                REVERSE: gl.constexpr):
    """The chunk's n rows of a pair of [B, L, M] arrays into two new shared buffers
    [CHUNK, BLOCK_M] by cp.async (VEC elements, 16 bytes, a thread), in GROUPS commit
    groups of CHUNK / GROUPS rows; row r is the token at ``x_*_c`` + r (``REVERSE``: - r)
    steps.  Masked elements (rows past n, lanes past M) arrive as zeros."""
    NW: gl.constexpr = gl.num_warps()
    COPY: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // COPY_COLS, COPY_COLS], [NW, 1],
                                          [1, 0])
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    GR: gl.constexpr = CHUNK // GROUPS
    xs_r = gl.allocate_shared_memory(x_r_c.dtype.element_ty, [CHUNK, BLOCK_M], SMEM)
    xs_i = gl.allocate_shared_memory(x_i_c.dtype.element_ty, [CHUNK, BLOCK_M], SMEM)
    rows = gl.arange(0, GR, layout=gl.SliceLayout(1, COPY))
    cols = mt * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, COPY))
    for g in gl.static_range(GROUPS):
        r = g * GR + rows
        if REVERSE:
            off = -r[:, None] * M + cols[None, :]
        else:
            off = r[:, None] * M + cols[None, :]
        mask = (r < n)[:, None] & (cols < M)[None, :]
        _copy_to_shared(xs_r.slice(g * GR, GR), x_r_c + off, mask=mask)
        _copy_to_shared(xs_i.slice(g * GR, GR), x_i_c + off, mask=mask)
        async_copy.commit_group()
    return xs_r, xs_i


@gluon.jit
def _stage_table(e_eta, cos_delta, sin_delta, CHUNK: gl.constexpr):
    """The chunk's control-table rows ([CHUNK] each, tokens along dim 0 of [CHUNK, 1]) into
    shared memory, each seen as CHUNK rows of [1] (a row read is ``.index(r)``)."""
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    SMEM_ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    tab_e = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM, gl.expand_dims(e_eta, 1))
    tab_c = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM,
                                      gl.expand_dims(cos_delta, 1))
    tab_s = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM,
                                      gl.expand_dims(sin_delta, 1))
    return (_as_rows(tab_e, gl.float32, CHUNK, 1, SMEM_ROWS),
            _as_rows(tab_c, gl.float32, CHUNK, 1, SMEM_ROWS),
            _as_rows(tab_s, gl.float32, CHUNK, 1, SMEM_ROWS))


@gluon.jit
def _spectrum(nu_log_ptr, theta_log_ptr, lane, lane_ok):
    """nu = e^nu_log, theta = e^theta_log, cos theta, sin theta of the program's lanes, fp32
    whatever the spectrum's dtype."""
    nu = gl.exp(gl.load(nu_log_ptr + lane, mask=lane_ok, other=0.0).to(gl.float32))
    theta = gl.exp(gl.load(theta_log_ptr + lane, mask=lane_ok, other=0.0).to(gl.float32))
    return nu, theta, gl.cos(theta), gl.sin(theta)


@gluon.jit
def _poll(sync_ptr, first_slot, j, r, status0, WIDTH: gl.constexpr):
    """One look-back poll: an acquire atomic on the statuses of the window of predecessors
    j - WIDTH + 1 .. j (``r``: [WIDTH] rows, oldest first; ``first_slot``: chunk 0's slot;
    none polled for j < 0), reduced to the key r * 4 + status of the newest row whose
    status is not 1 (-4: every row an aggregate; rows before chunk 0 read as status 2)."""
    chunk = j - (WIDTH - 1) + r
    exists = chunk >= 0
    word = gl.atomic_add(sync_ptr + 1 + (first_slot + chunk), gl.zeros_like(chunk),
                         mask=exists, sem="acquire")
    status = gl.where(exists, _status(word, status0), 2)
    return gl.max(gl.where(status != 1, r * 4 + status, -4), axis=0)


@gluon.jit
def _carry_in(sync_ptr, carry_ptr, slot, c, lane_t, init_r, init_i, status0,
              BLOCK_M: gl.constexpr, WIDTH: gl.constexpr, WL: gl.constexpr):
    """The state entering chunk ``c`` ([BLOCK_M] pair): predecessors c-1, c-2, ... polled
    WIDTH at a time (oldest first in a window), as
    :func:`samu_tune.kernels.lookback._look_back` does: the aggregates (status 1) after the
    newest row whose status is not 1 (``stop``) are composed into E = (ea, eb); its inclusive
    prefix s (status 2) ends the walk with ea s + eb, its status 0 polls again from it; a
    window of WIDTH aggregates moves WIDTH chunks back.  A status word holds ``status0`` +
    the status (an earlier launch's smaller value reads as 0).  One poll is one acquire
    atomic on the WIDTH statuses (``WL``: a layout of [WIDTH], :func:`_poll`); the payloads
    it makes valid are loaded together and the next window's poll goes out behind them, so a
    walk through aggregates waits one round trip per window, not two."""
    ea_r = gl.full_like(init_r, 1.0)
    ea_i = gl.zeros_like(init_r)
    eb_r = gl.zeros_like(init_r)
    eb_i = gl.zeros_like(init_r)
    carry_r = init_r
    carry_i = init_i
    r = gl.arange(0, WIDTH, layout=WL)
    lane_zero = lane_t * 0
    j = c - 1
    key = _poll(sync_ptr, slot - c, j, r, status0, WIDTH)
    while j >= 0:
        stop = (key + 4) // 4 - 1
        stop_status = key - 4 * stop
        stop_lanes = lane_zero + stop
        has = (lane_zero + stop_status) == 2
        newest = slot - c + j
        at = (carry_ptr + (newest - (WIDTH - 1) + stop).to(gl.int64) * (SLOT_ROWS * BLOCK_M)
              + lane_t)
        sr = gl.load(at + 4 * BLOCK_M, mask=has, other=0.0, volatile=True)
        si = gl.load(at + 5 * BLOCK_M, mask=has, other=0.0, volatile=True)
        rows = ()
        for k in gl.static_range(WIDTH):
            # chunk newest - k: an identity map (1, 0, 0, 0) unless after stop
            take = stop_lanes < WIDTH - 1 - k
            at = carry_ptr + (newest - k).to(gl.int64) * (SLOT_ROWS * BLOCK_M) + lane_t
            rows = rows + ((gl.load(at, mask=take, other=1.0, volatile=True),
                            gl.load(at + BLOCK_M, mask=take, other=0.0, volatile=True),
                            gl.load(at + 2 * BLOCK_M, mask=take, other=0.0, volatile=True),
                            gl.load(at + 3 * BLOCK_M, mask=take, other=0.0, volatile=True)),)
        # the next window polled while this one's payloads are in flight: one round trip a
        # window.  E waits on the poll's answer (``key >= -4`` always holds), else the
        # compiler places the poll after the composition, which waits on the payloads.  No
        # poll once a prefix ends the walk (a masked one still broadcasts through shared
        # memory between two CTA barriers)
        j = j - (WIDTH - 1 - stop)            # stop = -1: the whole window; stop = j: spin
        if stop_status == 2:
            j = c - c - 1
        else:
            key = _poll(sync_ptr, slot - c, j, r, status0, WIDTH)
            ea_r = gl.where(lane_zero + key >= -4, ea_r, 0.0)
        for k in gl.static_range(WIDTH):
            pr, pi, qr, qi = rows[k]
            eb_r, eb_i = cmul_add(ea_r, ea_i, qr, qi, eb_r, eb_i)
            ea_r, ea_i = cmul(ea_r, ea_i, pr, pi)
        if stop_status == 2:
            carry_r, carry_i = cmul_add(ea_r, ea_i, sr, si, eb_r, eb_i)
    return carry_r, carry_i


@gluon.jit
def _publish_and_look_back(sync_ptr, carry_ptr, slot, c, lane_t, pr, pi, qr, qi, init_r,
                           init_i, status0, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr,
                           WL: gl.constexpr):
    """The chunk's aggregate (P, Q) published in its slot (status 1; chunk 0 has no
    predecessor to wait for it), then the state entering the chunk (:func:`_carry_in`,
    ``init`` at chunk 0).  Returns (the state pair, the slot's payload base)."""
    base = carry_ptr + slot.to(gl.int64) * (SLOT_ROWS * BLOCK_M) + lane_t
    if c > 0:
        gl.store(base, pr)
        gl.store(base + BLOCK_M, pi)
        gl.store(base + 2 * BLOCK_M, qr)
        gl.store(base + 3 * BLOCK_M, qi)
        _publish(sync_ptr + 1 + slot, status0 + 1)
    hr, hi = _carry_in(sync_ptr, carry_ptr, slot, c, lane_t, init_r, init_i, status0, BLOCK_M,
                       WIDTH, WL)
    return hr, hi, base


@gluon.jit
def _publish_prefix(sync_ptr, base, slot, end_r, end_i, status0, BLOCK_M: gl.constexpr):
    """The chunk's inclusive prefix (the state leaving it) published in its slot (status 2)."""
    gl.store(base + 4 * BLOCK_M, end_r)
    gl.store(base + 5 * BLOCK_M, end_i)
    _publish(sync_ptr + 1 + slot, status0 + 2)


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
    """Grid: (B * n_mtiles * n_chunks,); the program id is ignored in favour of the ticket.
    VEC: elements per 16-byte copy; COPY_COLS: threads of a warp along a row in the copy
    (min(32, BLOCK_M / VEC)); WIDTH: predecessors read per look-back poll.  The head needs no
    zero fill between launches (``ticket0``, ``status0``: as in
    :func:`samu_tune.kernels.lookback.lookback_scan`)."""
    NW: gl.constexpr = gl.num_warps()
    ROW: gl.constexpr = gl.BlockedLayout([BLOCK_M // (32 * NW)], [32], [NW], [0])
    # a row of int32 words (``PACKED``)
    HALF: gl.constexpr = gl.BlockedLayout([max(BLOCK_M // (64 * NW), 1)], [32], [NW], [0])
    TOK: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    # a staged buffer seen as CHUNK rows of [BLOCK_M] (a row read is ``.index(r)``)
    SMEM_ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    GR: gl.constexpr = CHUNK // GROUPS

    M = M // 8 * 8                            # rows of 16-byte aligned copies (host-checked)
    c, b, mt, slot, start, n = _ticket_chunk(sync_ptr, ticket0, B, L, n_mtiles, n_chunks,
                                             CHUNK)
    tok0 = b.to(gl.int64) * L + start         # the chunk's first token (int64)

    # 1. the chunk's rows into shared memory, GROUPS commit groups
    xs_r, xs_i = _stage_rows(x_r_ptr + tok0 * M, x_i_ptr + tok0 * M, n, mt, M, CHUNK, BLOCK_M,
                             GROUPS, VEC, COPY_COLS, False)

    # bf16 rows read as int32 words (two values each) where a thread holds two or more modes
    PACKED: gl.constexpr = (x_r_ptr.dtype.element_ty == gl.bfloat16) & (BLOCK_M >= 64 * NW)
    if PACKED:
        rows_r = _as_rows(xs_r, gl.int32, CHUNK, BLOCK_M // 2, SMEM_ROWS)
        rows_i = _as_rows(xs_i, gl.int32, CHUNK, BLOCK_M // 2, SMEM_ROWS)
    else:
        rows_r = _as_rows(xs_r, xs_r.dtype, CHUNK, BLOCK_M, SMEM_ROWS)
        rows_i = _as_rows(xs_i, xs_i.dtype, CHUNK, BLOCK_M, SMEM_ROWS)

    # 2. the chunk's control table rows (every mode tile of the chunk writes the same values)
    # tokens along dim 0 of [CHUNK, 1] (the shared table's shape)
    TAB: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    k = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, TAB))
    ok = k < n
    tok = tok0 + k
    eta = gl.load(eta_ptr + tok, mask=ok, other=0.0).to(gl.float32)
    delta = gl.load(delta_ptr + tok, mask=ok, other=0.0).to(gl.float32)
    cd = gl.cos(delta)
    sd = gl.sin(delta)
    if HAS_RESETS:
        keep = gl.load(seg_ptr + tok, mask=ok, other=1) != 0
        cd = gl.where(keep, cd, 0.0)
        sd = gl.where(keep, sd, 0.0)
    e_eta = gl.exp(eta)
    trow = ctl_ptr + tok * TABLE_COLS
    gl.store(trow, e_eta, mask=ok)
    gl.store(trow + 1, cd, mask=ok)
    gl.store(trow + 2, sd, mask=ok)
    gl.store(trow + 3, gl.zeros_like(cd), mask=ok)
    # the walks' copy (visible to every thread after the summary's first CTA barrier)
    tab = _stage_table(e_eta, cd, sd, CHUNK)

    lane_t = gl.arange(0, BLOCK_M, layout=ROW)
    lane = mt * BLOCK_M + lane_t
    lane_ok = lane < M
    nu, theta, cos_theta, sin_theta = _spectrum(nu_log_ptr, theta_log_ptr, lane, lane_ok)

    # P = prod A = e^(-nu sum e^eta) e^(i (n theta + sum delta)), 0 where a row resets, while
    # the copies land
    s_eta = gl.sum(gl.where(ok, e_eta, 0.0), axis=0)
    s_delta = gl.sum(gl.where(ok, delta, 0.0), axis=0)
    p_rad = gl.exp2((nu * -1.4426950408889634) * s_eta)
    if HAS_RESETS:
        resets = gl.sum(gl.where(keep, 0, 1), axis=0)     # rows past n keep (other=1)
        p_rad = gl.where(resets > 0, 0.0, p_rad)
    ang = n.to(gl.float32) * theta + s_delta
    pr = p_rad * gl.cos(ang)
    pi = p_rad * gl.sin(ang)
    # 3. summary: the chunk's map z -> P z + Q, Q from its staged rows, each group as it lands
    qr = gl.zeros_like(nu)
    qi = gl.zeros_like(nu)
    blocks = n // UNROLL
    for g in gl.static_range(GROUPS):
        async_copy.wait_group(GROUPS - 1 - g)
        _cta_barrier()                   # other threads' copies (and the table rows)
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
    hr, hi, base = _publish_and_look_back(sync_ptr, carry_ptr, slot, c, lane_t, pr, pi, qr, qi,
                                          init_r, init_i, status0, BLOCK_M, WIDTH, TOK)
    end_r, end_i = cmul_add(pr, pi, hr, hi, qr, qi)
    _publish_prefix(sync_ptr, base, slot, end_r, end_i, status0, BLOCK_M)

    # 5. replay from shared memory: every state, in the output dtype
    y_r_c = y_r_ptr + tok0 * M
    y_i_c = y_i_ptr + tok0 * M
    for rb in range(0, blocks):
        block = _rows(rows_r, rows_i, tab, rb * UNROLL, nu, cos_theta, sin_theta, ROW,
                      HALF, PACKED, UNROLL)
        for u in gl.static_range(UNROLL):
            r = rb * UNROLL + u
            ar, ai, ur, ui = block[u]
            hr, hi = cmul_add(ar, ai, hr, hi, ur, ui)
            gl.store(y_r_c + r * M + lane, hr.to(y_r_ptr.dtype.element_ty), mask=lane_ok)
            gl.store(y_i_c + r * M + lane, hi.to(y_i_ptr.dtype.element_ty), mask=lane_ok)
    for r in range(blocks * UNROLL, n):
        ar, ai, ur, ui = _rows(rows_r, rows_i, tab, r, nu, cos_theta, sin_theta, ROW, HALF,
                               PACKED, 1)[0]
        hr, hi = cmul_add(ar, ai, hr, hi, ur, ui)
        gl.store(y_r_c + r * M + lane, hr.to(y_r_ptr.dtype.element_ty), mask=lane_ok)
        gl.store(y_i_c + r * M + lane, hi.to(y_i_ptr.dtype.element_ty), mask=lane_ok)
    last = lane_ok & (c == n_chunks - 1)
    gl.store(end_r_ptr + state_off, end_r, mask=last)
    gl.store(end_i_ptr + state_off, end_i, mask=last)
