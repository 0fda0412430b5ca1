"""The read-once look-back kernels' shared Gluon parts: the ticket, the chunk staged in
shared memory, the spectrum, and the look-back protocol (publish the aggregate, look back,
publish the inclusive prefix) of :func:`samu_tune.kernels.lookback.lookback_scan`, whose
head, slots and statuses they share.  Used by :mod:`samu_tune.kernels.lookback_once`
(forward) and :mod:`samu_tune.kernels.lookback_once_backward`.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from samu_tune.kernels.complex_math import cmul, cmul_add
from samu_tune.kernels.lookback import SLOT_ROWS, _publish, _status

# names that changed after Triton 3.6: cp.async global -> shared (``async_load``), the CTA
# barrier (``barrier``) and a shared buffer seen with another shape or layout
# (``reinterpret``)
copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def as_rows(buf, DTYPE: gl.constexpr, CHUNK: gl.constexpr, W: gl.constexpr,
             LAYOUT: gl.constexpr):
    """``buf`` seen as CHUNK rows of [W] ``DTYPE`` (``.index(r)`` a row): its own rows, or a
    bf16 buffer's rows as int32 words (W half its width)."""
    if _NEW_REINTERPRET:
        rows = buf.reinterpret(DTYPE, [CHUNK, W], LAYOUT)
    else:
        rows = buf._reinterpret(DTYPE, [CHUNK, W], LAYOUT)
    return rows


@gluon.jit
def decode_ticket(ticket, B, L, n_mtiles, n_chunks, CHUNK: gl.constexpr):
    """A ticket's work, chunk slowest: (chunk c, b, mode tile mt, slot, the chunk's first
    step ``start`` in walk order, its rows n; n = 0 for a ticket past the last)."""
    per_chunk = B * n_mtiles
    c = ticket // per_chunk
    rest = ticket % per_chunk
    b = rest // n_mtiles
    mt = rest % n_mtiles
    slot = (b * n_mtiles + mt) * n_chunks + c
    start = c * CHUNK
    n = gl.where(ticket < per_chunk * n_chunks, gl.minimum(L - start, CHUNK), 0)
    return c, b, mt, slot, start, n


@gluon.jit
def ticket_chunk(sync_ptr, ticket0, B, L, n_mtiles, n_chunks, CHUNK: gl.constexpr):
    """The program's work from its ticket (``ticket0``: the head's base, as in
    :func:`samu_tune.kernels.lookback.lookback_scan`): :func:`decode_ticket`.  Relaxed: the
    ticket only orders work; payloads are ordered by the status atomics."""
    ticket = gl.atomic_add(sync_ptr, 1, sem="relaxed") - ticket0
    return decode_ticket(ticket, B, L, n_mtiles, n_chunks, CHUNK)


@gluon.jit
def stage_group(xs_r, xs_i, x_r_c, x_i_c, n, mt, M, g: gl.constexpr, CHUNK: gl.constexpr,
                BLOCK_M: gl.constexpr, GROUPS: gl.constexpr, VEC: gl.constexpr,
                COPY_COLS: gl.constexpr, REVERSE: gl.constexpr):
    """Commit group ``g`` of a chunk's staging: rows g CHUNK / GROUPS .. (g + 1) CHUNK / GROUPS
    - 1 of a pair of [B, L, M] arrays into the shared buffers ``xs_*`` [CHUNK, BLOCK_M] by
    cp.async (VEC elements, 16 bytes, a thread); row r is the token at ``x_*_c`` + r
    (``REVERSE``: - r) steps.  Masked elements (rows past n, lanes past M) arrive as zeros."""
    NW: gl.constexpr = gl.num_warps()
    COPY: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // COPY_COLS, COPY_COLS], [NW, 1],
                                          [1, 0])
    GR: gl.constexpr = CHUNK // GROUPS
    rows = gl.arange(0, GR, layout=gl.SliceLayout(1, COPY))
    cols = mt * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, COPY))
    r = g * GR + rows
    if REVERSE:
        off = -r[:, None] * M + cols[None, :]
    else:
        off = r[:, None] * M + cols[None, :]
    mask = (r < n)[:, None] & (cols < M)[None, :]
    copy_to_shared(xs_r.slice(g * GR, GR), x_r_c + off, mask=mask)
    copy_to_shared(xs_i.slice(g * GR, GR), x_i_c + off, mask=mask)
    async_copy.commit_group()


@gluon.jit
def stage_rows(x_r_c, x_i_c, n, mt, M, CHUNK: gl.constexpr, BLOCK_M: gl.constexpr,
                GROUPS: gl.constexpr, VEC: gl.constexpr, COPY_COLS: gl.constexpr,
                REVERSE: gl.constexpr):
    """The chunk's n rows of a pair of [B, L, M] arrays into two new shared buffers
    [CHUNK, BLOCK_M], in GROUPS commit groups (:func:`stage_group`)."""
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    xs_r = gl.allocate_shared_memory(x_r_c.dtype.element_ty, [CHUNK, BLOCK_M], SMEM)
    xs_i = gl.allocate_shared_memory(x_i_c.dtype.element_ty, [CHUNK, BLOCK_M], SMEM)
    for g in gl.static_range(GROUPS):
        stage_group(xs_r, xs_i, x_r_c, x_i_c, n, mt, M, g, CHUNK, BLOCK_M, GROUPS, VEC,
                    COPY_COLS, REVERSE)
    return xs_r, xs_i


@gluon.jit
def stage_table(e_eta, cos_delta, sin_delta, CHUNK: gl.constexpr):
    """The chunk's control-table rows ([CHUNK] each, tokens along dim 0 of [CHUNK, 1]) into
    shared memory, each seen as CHUNK rows of [1] (a row read is ``.index(r)``)."""
    SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    SMEM_ROWS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    tab_e = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM, gl.expand_dims(e_eta, 1))
    tab_c = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM,
                                      gl.expand_dims(cos_delta, 1))
    tab_s = gl.allocate_shared_memory(gl.float32, [CHUNK, 1], SMEM,
                                      gl.expand_dims(sin_delta, 1))
    return (as_rows(tab_e, gl.float32, CHUNK, 1, SMEM_ROWS),
            as_rows(tab_c, gl.float32, CHUNK, 1, SMEM_ROWS),
            as_rows(tab_s, gl.float32, CHUNK, 1, SMEM_ROWS))


@gluon.jit
def spectrum_of(nu_log, theta_log):
    """nu = e^nu_log, theta = e^theta_log, cos theta, sin theta of fp32 [BLOCK_M] logs."""
    nu = gl.exp(nu_log)
    theta = gl.exp(theta_log)
    return nu, theta, gl.cos(theta), gl.sin(theta)


@gluon.jit
def spectrum(nu_log_ptr, theta_log_ptr, lane, lane_ok):
    """:func:`spectrum_of` the program's lanes, fp32 whatever the spectrum's dtype."""
    return spectrum_of(gl.load(nu_log_ptr + lane, mask=lane_ok, other=0.0).to(gl.float32),
                       gl.load(theta_log_ptr + lane, mask=lane_ok, other=0.0).to(gl.float32))


@gluon.jit
def poll(sync_ptr, first_slot, j, r, status0, WIDTH: gl.constexpr):
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
def carry_in(sync_ptr, carry_ptr, slot, c, lane_t, init_r, init_i, status0,
              BLOCK_M: gl.constexpr, WIDTH: gl.constexpr, WL: gl.constexpr):
    """The state entering chunk ``c`` ([BLOCK_M] pair): predecessors c-1, c-2, ... polled
    WIDTH at a time (oldest first in a window), as
    :func:`samu_tune.kernels.lookback._look_back` does: the aggregates (status 1) after the
    newest row whose status is not 1 (``stop``) are composed into E = (ea, eb); its inclusive
    prefix s (status 2) ends the walk with ea s + eb, its status 0 polls again from it; a
    window of WIDTH aggregates moves WIDTH chunks back.  A status word holds ``status0`` +
    the status (an earlier launch's smaller value reads as 0).  One poll is one acquire
    atomic on the WIDTH statuses (``WL``: a layout of [WIDTH], :func:`poll`); the payloads
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
    key = poll(sync_ptr, slot - c, j, r, status0, WIDTH)
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
            key = poll(sync_ptr, slot - c, j, r, status0, WIDTH)
            ea_r = gl.where(lane_zero + key >= -4, ea_r, 0.0)
        for k in gl.static_range(WIDTH):
            pr, pi, qr, qi = rows[k]
            eb_r, eb_i = cmul_add(ea_r, ea_i, qr, qi, eb_r, eb_i)
            ea_r, ea_i = cmul(ea_r, ea_i, pr, pi)
        if stop_status == 2:
            carry_r, carry_i = cmul_add(ea_r, ea_i, sr, si, eb_r, eb_i)
    return carry_r, carry_i


@gluon.jit
def publish_and_look_back(sync_ptr, carry_ptr, slot, c, lane_t, pr, pi, qr, qi, init_r,
                           init_i, status0, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr,
                           WL: gl.constexpr):
    """The chunk's aggregate (P, Q) published in its slot (status 1; chunk 0 has no
    predecessor to wait for it), then the state entering the chunk (:func:`carry_in`,
    ``init`` at chunk 0).  Returns (the state pair, the slot's payload base)."""
    base = carry_ptr + slot.to(gl.int64) * (SLOT_ROWS * BLOCK_M) + lane_t
    if c > 0:
        gl.store(base, pr)
        gl.store(base + BLOCK_M, pi)
        gl.store(base + 2 * BLOCK_M, qr)
        gl.store(base + 3 * BLOCK_M, qi)
        _publish(sync_ptr + 1 + slot, status0 + 1)
    hr, hi = carry_in(sync_ptr, carry_ptr, slot, c, lane_t, init_r, init_i, status0, BLOCK_M,
                       WIDTH, WL)
    return hr, hi, base


@gluon.jit
def publish_prefix(sync_ptr, base, slot, end_r, end_i, status0, BLOCK_M: gl.constexpr):
    """The chunk's inclusive prefix (the state leaving it) published in its slot (status 2)."""
    gl.store(base + 4 * BLOCK_M, end_r)
    gl.store(base + 5 * BLOCK_M, end_i)
    _publish(sync_ptr + 1 + slot, status0 + 2)
