"""Single-pass scan with decoupled look-back: every input read once, every output written once.

One program per (batch row b, mode tile, time chunk); B * n_mtiles * n_chunks programs.  A
program takes a ticket from a global counter (``sync[0]``) and maps it to its work with the
chunk as the slowest index: chunks are started in order, so a program only ever waits on
programs that already run, whatever order the hardware schedules them in.

Per program ([CHUNK, BLOCK_M] tile, the transition evaluated in registers):

1. (P[r], Q[r]) = composition of rows 0..r of z -> A z + u (``tile_scan``); the chunk's
   aggregate is the last row (padding rows are the identity).
2. Publish the aggregate with status 1 (which chunks do: below).
3. Look back over predecessor chunks of the same (b, mode tile), WIDTH of them per poll
   (``_look_back``): spin while the newest not yet composed has status 0; status 2 (its
   inclusive prefix, the state after it) ends the walk, status 1 (its aggregate) is composed
   in and the walk continues further back.  Chunk 0 starts from ``init``.
4. Publish the inclusive prefix P[last] carry + Q[last] with status 2 (which chunks do: below).
5. Replay: state[r] = P[r] carry + Q[r] for every row, stored in the output dtype.

Who publishes what, with ``window`` W (a runtime value):

- DECOUPLED (W = 1 in production): every chunk c > 0 publishes its aggregate before looking
  back, and chunks with c % W == 0 their inclusive prefix after.  How far back a walk goes
  depends on timing, so the combination order, and the last bits of the result, vary.
- chained (not DECOUPLED): chunks with c % W == 0 publish only their inclusive prefix, the
  others only their aggregate.  A walk from c therefore always composes the aggregates of
  c-1 .. j+1 and ends at the inclusive prefix of j = the multiple of W below c: one fixed
  combination order, bitwise deterministic.  W = 1 waits for the immediate predecessor's
  prefix (a chain of n_chunks hops); larger W makes the dependent chain W times shorter.

Tests raise W in decoupled mode to drive the aggregate path under the interpreter, where
programs run one after the other and a predecessor is always complete.

Forward (REVERSE=False): h[t] = A[t] h[t-1] + (br + i bi)[t], init = h0 or 0; out = h; the
last chunk writes the final state (fp32).

LOOP (loop-inner variant): instead of a [CHUNK, BLOCK_M] tile in registers, the program walks
its CHUNK * SUB rows one at a time on [BLOCK_M] vectors with a rolled loop, twice: the summary
composes (P, Q) <- (A P, A Q + u) row by row, the replay runs h = A h + u from the carry
(reverse: the adjoint and its gradients), re-reading the chunk's inputs and recomputing A.
The re-read is served by L2 only while the chunks in flight fit it: at (8, 8192, 1024) on the
H200 they do not, and the forward reads its inputs twice from DRAM (docs/performance.md).
Reading a chunk once and keeping its rows in registers from the summary to the replay (16-
or 32-row chunks unrolled, 163-255 registers a thread) ran slower there on an H100: 0.38-0.43
ms forward against 0.295 ms for the loop walk's 64-row chunks.
A row's controls (e^eta, cos delta, sin delta, resets applied) come from a per-token table
(:mod:`samu_tune.kernels.controls`) that the forward writes for its own chunk first
(MAKE_TABLE; the SAMU controller writes it for the fused layer) and the backward reads again:
no per-thread exp/cos/sin of the token (libdevice trig has a range-reduction loop, a branch
the next row's loads cannot be hoisted over).  Both walks are the
chunk family's (:mod:`samu_tune.kernels.chunk_walk`, same per-row contract as the tile replay:
grad b, control gradients per token (partials per mode tile, or ATOMIC sums), spectrum gradients
per lane, grad h0 in the chunk holding t = 0).  A thread holds a few [BLOCK_M / threads]-vectors
whatever the chunk length: few registers, high occupancy; each row's dependent chain is two
complex FMAs per lane.  STAGES 1: each walk step loads the next step's rows into registers
(PREFETCH); STAGES N > 1: the walks' loop runs under Triton's software pipeliner with N stages,
which stages the next N - 1 steps' rows and controls in shared memory with cp.async (PTX of
Triton 3.6: every row and control load of both walks), more bytes in flight per program than
registers could hold (about 10% faster at 64-step chunks on the H200: docs/performance.md).

Backward (REVERSE=True), time walked from L-1 down (``tile_times``):
g[t] = conj(A[t+1]) g[t+1] + dout[t], init = d final state; grad b = g;
dL/dA[t] = g[t] conj(h[t-1]) with h[t-1] read from the saved outputs (h0 or 0 at t = 0);
grad h0 = conj(A[0]) g[0]; the control and spectrum gradients either float-atomically added
into zeroed [B, L] / [M] sums (ATOMIC: decoupled look-back, no reduction launch after the
kernel) or stored as partials [B, L, n_mtiles] / [B, n_chunks, M] (fp32) that the caller
reduces with torch in a fixed order (chained look-back: deterministic).

Memory ordering: payloads are stored by every thread, then a CTA barrier, then one release
atomic sets the status (the release is cumulative over the writes the barrier ordered before
it).  Readers poll with an acquire atomic per window status (the result is broadcast through
shared memory behind a barrier, for tensor atomics too in Triton 3.6 and 3.9: checked in the
SASS; Triton 3.3 did not, triton-lang/triton#7402) and read payloads with volatile loads (not
served from L1).

Long because the kernel and its look-back protocol are one unit: forward and backward
(``REVERSE``), tile and loop inner walks share every helper here.
"""
import triton
import triton.language as tl

from samu_tune.kernels.chunk_walk import walk_replay, walk_summary
from samu_tune.kernels.complex_math import cmul, cmul_conj
from samu_tune.kernels.controls import store_rows
from samu_tune.kernels.tile import load_transition, scan_transition, tile_scan, tile_times, transition_gradients

# payload rows per slot: aggregate (Pr, Pi, Qr, Qi), then inclusive prefix (r, i)
SLOT_ROWS = tl.constexpr(6)


@triton.jit
def _last_row(x, is_last):
    """Row ``is_last`` of a [CHUNK, BLOCK_M] tile as [BLOCK_M]."""
    return tl.sum(tl.where(is_last[:, None], x, 0.0), axis=0)


@triton.jit
def _publish(flag_ptr, status):
    """Set a status after this program's payload stores (all threads) are visible GPU-wide."""
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, status, sem="release")


@triton.jit
def _status(word, status0):
    """The status a word of the head holds for a launch with ``status0``: the word less
    ``status0``, and 0 (not yet published) for a word an earlier launch left (below)."""
    return tl.maximum(word - status0, 0)


@triton.jit
def _window_stop(status, WIDTH: tl.constexpr):
    """Where a look-back window ends: statuses [WIDTH] of a window's predecessors, oldest
    first (row r: chunk j - WIDTH + 1 + r).  Returns (stop, stop_status): the newest row whose
    status is not 1 (-1 if every row holds a published aggregate) and its status (0: not yet
    published, 2: an inclusive prefix; 0 when stop = -1).  The rows after stop are the
    aggregates to compose.  One reduction: the key r * 4 + status orders by row."""
    r = tl.arange(0, WIDTH)
    key = tl.max(tl.where(status != 1, r * 4 + status, -4), axis=0)
    stop = (key + 4) // 4 - 1                 # floor: key >= -4
    return stop, key - 4 * stop


@triton.jit
def _look_back(sync_ptr, carry_ptr, slot, c, lane_t, init_r, init_i, status0,
               BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
    """The state entering chunk ``c`` ([BLOCK_M] pair): walk predecessors c-1, c-2, ... in
    windows of WIDTH chunks.  A status word holds ``status0`` + the status this launch
    published; a smaller value is an earlier launch's and reads as 0 (not yet published).

    A window is predecessors j - WIDTH + 1 .. j (j: the newest not yet composed); row r of
    its statuses [WIDTH] is chunk j - WIDTH + 1 + r (oldest first).  Chunk 0 always publishes
    its inclusive prefix, so a walk ends there at the latest (rows before chunk 0 read as
    status 2, never reached).  One poll is one vector acquire atomic
    on the WIDTH statuses, then the payloads they make valid: the aggregates of the rows after
    ``stop`` (the newest row not holding an aggregate, :func:`_window_stop`) and, when stop's
    status is 2, its inclusive prefix (masked loads, independent of each other: one L2 round
    trip for all).  The aggregates extend E newest first, each on [BLOCK_M] vectors in the
    lanes' own registers (no cross-thread step; rows at or before stop are identity maps,
    which change nothing), the order of a walk one predecessor at a time.  Then stop's status
    decides: 2 ends the walk; 0 (not yet published) polls again from stop, the aggregates
    after it composed already (stop = j: spin); no stop (WIDTH aggregates) moves the window
    WIDTH chunks back.  WIDTH = 1 is the walk one predecessor per poll.

    E = (ea, eb) composes the aggregates of chunks j+1 .. c-1 already passed, so the carry is
    ea * s + eb once the inclusive prefix s is found.
    """
    ea_r = tl.full((BLOCK_M,), 1.0, tl.float32)
    ea_i = tl.zeros((BLOCK_M,), tl.float32)
    eb_r = tl.zeros((BLOCK_M,), tl.float32)
    eb_i = tl.zeros((BLOCK_M,), tl.float32)
    carry_r = init_r
    carry_i = init_i
    r = tl.arange(0, WIDTH)                                                      # [WIDTH]
    lane_zero = lane_t * 0                                                       # [BLOCK_M]
    j = c - 1
    while j >= 0:
        chunk = j - (WIDTH - 1) + r                                              # [WIDTH]
        exists = chunk >= 0
        status = tl.atomic_add(sync_ptr + 1 + (slot - c + chunk), tl.zeros_like(chunk),
                               mask=exists, sem="acquire")
        status = _status(status, status0)
        status = tl.where(exists, status, 2)     # before chunk 0: a stop, never reached
        stop, stop_status = _window_stop(status, WIDTH)
        # per-lane masks from tensors (the interpreter rejects a tensor & scalar-bool mask)
        stop_lanes = lane_zero + stop                                            # [BLOCK_M]
        # stop's inclusive prefix, issued with the aggregates
        has = (lane_zero + stop_status) == 2
        at = (carry_ptr + (slot - c + j - (WIDTH - 1) + stop).to(tl.int64) * (SLOT_ROWS * BLOCK_M)
              + lane_t)
        sr = tl.load(at + 4 * BLOCK_M, mask=has, other=0.0, volatile=True)
        si = tl.load(at + 5 * BLOCK_M, mask=has, other=0.0, volatile=True)
        # every payload load issued before the first use (program order is the PTX's
        # order; a load after a use of another would wait a round trip)
        rows = ()
        for k in tl.static_range(WIDTH):
            # chunk j - k (row WIDTH - 1 - k), an identity map unless after stop
            take = stop_lanes < WIDTH - 1 - k
            at = (carry_ptr + (slot - c + j - k).to(tl.int64) * (SLOT_ROWS * BLOCK_M)
                  + lane_t)
            rows = rows + ((tl.load(at, mask=take, other=1.0, volatile=True),
                            tl.load(at + BLOCK_M, mask=take, other=0.0, volatile=True),
                            tl.load(at + 2 * BLOCK_M, mask=take, other=0.0, volatile=True),
                            tl.load(at + 3 * BLOCK_M, mask=take, other=0.0, volatile=True)),)
        for k in tl.static_range(WIDTH):
            # E := E o (P, Q) of chunk j - k: the older map applies first
            pr, pi, qr, qi = rows[k]
            br_, bi_ = cmul(ea_r, ea_i, qr, qi)
            eb_r += br_
            eb_i += bi_
            ea_r, ea_i = cmul(ea_r, ea_i, pr, pi)
        if stop_status == 2:
            carry_r, carry_i = cmul(ea_r, ea_i, sr, si)
            carry_r += eb_r
            carry_i += eb_i
            j = c - c - 1
        else:
            j = j - (WIDTH - 1 - stop)        # stop = -1: the whole window; stop = j: spin
    return carry_r, carry_i


@triton.jit
def _tile_maps(eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row_base, start, L, M, lane,
               lane_ok, nu, cos_theta, sin_theta, HAS_RESETS: tl.constexpr,
               REVERSE: tl.constexpr, CHUNK: tl.constexpr):
    """The tile of rows start .. start + CHUNK - 1 (in scan order) scanned from a zero carry.

    Returns (pr, pi, qr, qi) [CHUNK, BLOCK_M] (row r: state after it = P[r] z_in + Q[r]) and
    the tile's addressing: t, valid [CHUNK], tok [CHUNK], off, mask [CHUNK, BLOCK_M].
    """
    t, valid = tile_times(start, L, CHUNK, REVERSE)                              # [CHUNK]
    tok = row_base + t                                                           # [CHUNK]
    off = tok[:, None] * M + lane[None, :]                                       # [CHUNK, BLOCK_M]
    mask = valid[:, None] & lane_ok[None, :]
    ar, ai = scan_transition(eta_ptr, delta_ptr, seg_ptr, row_base, t, valid, L, nu, cos_theta,
                             sin_theta, HAS_RESETS, REVERSE)                     # [CHUNK, BLOCK_M]
    ur = tl.load(x_r_ptr + off, mask=mask, other=0.0).to(tl.float32)
    ui = tl.load(x_i_ptr + off, mask=mask, other=0.0).to(tl.float32)
    pr, pi, qr, qi = tile_scan(ar, ai, ur, ui)
    return pr, pi, qr, qi, t, valid, tok, off, mask


@triton.jit
def _replay(pr, pi, qr, qi, carry_r, carry_i, t, valid, tok, off, mask, eta_ptr, delta_ptr,
            seg_ptr, y_r_ptr, y_i_ptr, h0_r_ptr, h0_i_ptr, gx_r_ptr, gx_i_ptr, gh0_r_ptr,
            gh0_i_ptr, p_eta_ptr, p_delta_ptr, row_base, state_off, lane_ok, last_chunk, M, mt,
            n_mtiles, nu, theta, cos_theta, sin_theta, HAS_RESETS: tl.constexpr,
            HAS_H0: tl.constexpr, REVERSE: tl.constexpr, CHUNK: tl.constexpr,
            ATOMIC: tl.constexpr = False):
    """Replay one tile from its carry-in: store the states (forward) or grad b and the
    control partials (reverse).  Returns the carry out ([BLOCK_M] pair: the state after the
    tile's last row; padding rows are the identity) and the tile's spectrum partials
    (d nu_log, d theta_log) per lane (zeros forward)."""
    sr = pr * carry_r[None, :] - pi * carry_i[None, :] + qr                      # [CHUNK, BLOCK_M]
    si = pr * carry_i[None, :] + pi * carry_r[None, :] + qi
    is_last = tl.arange(0, CHUNK) == CHUNK - 1
    out_r = _last_row(sr, is_last)                                               # [BLOCK_M]
    out_i = _last_row(si, is_last)
    if REVERSE:
        # sr + i si = g[t]: grad b, then the transition's gradients against h[t-1]
        tl.store(gx_r_ptr + off, sr.to(gx_r_ptr.dtype.element_ty), mask=mask)
        tl.store(gx_i_ptr + off, si.to(gx_i_ptr.dtype.element_ty), mask=mask)
        at_r, at_i, log_radius, _ = load_transition(
            eta_ptr, delta_ptr, seg_ptr, row_base, t, valid, nu, cos_theta, sin_theta,
            HAS_RESETS)                                       # A[t]: zero on resets and padding
        has_prev = mask & (t > 0)[:, None]
        hr = tl.load(y_r_ptr + off - M, mask=has_prev, other=0.0).to(tl.float32)
        hi = tl.load(y_i_ptr + off - M, mask=has_prev, other=0.0).to(tl.float32)
        if HAS_H0:
            # h[-1] = h0, only in the tile holding t = 0 (in the last chunk)
            at0 = (t == 0)[:, None] & mask
            h0r = tl.load(h0_r_ptr + state_off, mask=lane_ok & last_chunk, other=0.0)
            h0i = tl.load(h0_i_ptr + state_off, mask=lane_ok & last_chunk, other=0.0)
            hr = tl.where(at0, h0r.to(tl.float32)[None, :], hr)
            hi = tl.where(at0, h0i.to(tl.float32)[None, :], hi)
        d_eta, d_delta = transition_gradients(sr, si, hr, hi, at_r, at_i, log_radius)
        d_eta = tl.where(mask, d_eta, 0.0)
        d_delta = tl.where(mask, d_delta, 0.0)
        if ATOMIC:
            tl.atomic_add(p_eta_ptr + tok, tl.sum(d_eta, axis=1), mask=valid)
            tl.atomic_add(p_delta_ptr + tok, tl.sum(d_delta, axis=1), mask=valid)
        else:
            tl.store(p_eta_ptr + tok * n_mtiles + mt, tl.sum(d_eta, axis=1), mask=valid)
            tl.store(p_delta_ptr + tok * n_mtiles + mt, tl.sum(d_delta, axis=1), mask=valid)
        if HAS_H0:
            g0r, g0i = cmul_conj(at_r, at_i, sr, si)
            # per-lane flag: this tile holds t = 0 (a tensor, not a scalar bool: interpreter)
            holds_t0 = (tl.zeros_like(lane_ok.to(tl.int32))
                        + tl.sum((t == 0).to(tl.int32), axis=0)) > 0
            keep = lane_ok & last_chunk & holds_t0
            tl.store(gh0_r_ptr + state_off, _last_row(g0r, t == 0), mask=keep)
            tl.store(gh0_i_ptr + state_off, _last_row(g0i, t == 0), mask=keep)
        return out_r, out_i, tl.sum(d_eta, axis=0), tl.sum(d_delta, axis=0) * theta
    else:
        tl.store(y_r_ptr + off, sr.to(y_r_ptr.dtype.element_ty), mask=mask)
        tl.store(y_i_ptr + off, si.to(y_i_ptr.dtype.element_ty), mask=mask)
        zero = tl.zeros_like(out_r)
        return out_r, out_i, zero, zero


@triton.jit(do_not_specialize=["B", "L", "M", "n_mtiles", "n_chunks", "window", "ticket0",
                               "status0"])
def lookback_scan(
    sync_ptr,                    # [1 + n_slots] int32: ticket counter, then statuses (below)
    carry_ptr,                   # [n_slots, SLOT_ROWS, BLOCK_M] f32 published summaries
    eta_ptr, delta_ptr,          # [B, L] controls (f32 / bf16)
    nu_log_ptr, theta_log_ptr,   # [M] spectrum (f32)
    seg_ptr,                     # [B, L] int segment positions (HAS_RESETS)
    ctl_ptr,                     # LOOP: [B L, 4] f32 control table (kernels.controls;
                                 #   MAKE_TABLE: written here, forward)
    gamma_ptr,                   # FUSED: [M] f32 write scale of the SAMU layer
    o_ptr,                       # FUSED [B, L, 2M]: fwd layer output (written), rev grad x
    xw_ptr,                      # FUSED rev: the layer input x [B, L, 2M] (read: d gamma)
    p_gamma_ptr,                 # FUSED rev: partial grad gamma [B, n_chunks, M] (ATOMIC: [M]) f32
    x_r_ptr, x_i_ptr,            # fwd: br, bi          rev: d out        [B, L, M]
    h0_r_ptr, h0_i_ptr,          # [B, M] initial state (HAS_H0)
    y_r_ptr, y_i_ptr,            # fwd: out (written)   rev: out (read as h[t-1])  [B, L, M]
    end_r_ptr, end_i_ptr,        # fwd: final state (written)  rev: its gradient (read)  [B, M] f32
    gx_r_ptr, gx_i_ptr,          # rev: grad br, bi (written)  [B, L, M]
    gh0_r_ptr, gh0_i_ptr,        # rev: grad h0 (written, HAS_H0)  [B, M] f32
    p_eta_ptr, p_delta_ptr,      # rev: grad eta, delta partials [B, L, n_mtiles] f32
                                 #   (ATOMIC: sums [B, L], zeroed)
    p_nu_ptr, p_theta_ptr,       # rev: grad nu_log, theta_log partials [B, n_chunks, M] f32
                                 #   (ATOMIC: sums [M], zeroed)
    B, L, M, n_mtiles, n_chunks, window,
    ticket0, status0,            # the head's values before this launch (below)
    HAS_RESETS: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr,
    DECOUPLED: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, SUB: tl.constexpr,
    LOOP: tl.constexpr, M_ALIGN: tl.constexpr = 1, FUSED: tl.constexpr = False,
    SAVE_H: tl.constexpr = False, ROWS: tl.constexpr = 1, WIDTH: tl.constexpr = 1,
    REBASE: tl.constexpr = True, STAGES: tl.constexpr = 1, HAS_END: tl.constexpr = True,
    ATOMIC: tl.constexpr = False, MAKE_TABLE: tl.constexpr = False,
):
    """Grid: (B * n_mtiles * n_chunks,); the program id is ignored in favour of the ticket.

    A chunk is SUB tiles of CHUNK rows (n_chunks = cdiv(L, SUB * CHUNK)).  SUB = 1: the tile
    stays in registers from the summary to the replay.  SUB > 1: the summary walks the SUB
    tiles composing their maps (registers hold one tile), and the replay walks them again
    (the second read of a chunk's inputs is served from L2): SUB times more bytes per program
    and a SUB times shorter look-back chain, for twice the tile scans.  LOOP: the CHUNK * SUB
    rows are walked one at a time instead (see the module docstring), their controls read
    from the control table ``ctl_ptr`` (unused otherwise).

    M_ALIGN (8 or 1): M is a multiple of it.  M is not specialised (one binary for every
    shape), so without this its alignment is unknown and every row access is a 2-byte
    load/store with its own address; stated as M = (M // 8) 8 the compiler sees rows of 8
    aligned elements and vectorises them (16 bytes of bf16; at most two binaries).

    FUSED (LOOP only): the SAMU layer in one pass per direction.  x_r_ptr is the layer input
    x [B, L, 2M] forward, d y backward (x_i_ptr unused: the imaginary half starts at + M);
    the write is x * gamma rounded to x's dtype; o_ptr receives the layer output
    relu(cat(Re h, Im h)) forward and grad x = g * gamma backward (both [B, L, 2M]); y_r_ptr /
    y_i_ptr are the states h [B, L, M] as in the plain scan: written forward when SAVE_H
    (training), read backward (h[t-1], and the relu mask h[t] > 0); backward also writes the
    partial d gamma = sum of g . x per (row, chunk, mode) (ATOMIC: adds it into [M]).

    ROWS (LOOP only; 1 or 2): rows per step of the walks, their loads issued together (see
    :func:`~samu_tune.kernels.chunk_walk.walk_summary`).
    WIDTH: predecessors read per look-back poll (:func:`_look_back`; 1 in chained mode).
    REBASE (LOOP only): the walks index from pointers rebased at the chunk's first token
    (:func:`~samu_tune.kernels.chunk_walk._chunk_base`), else by token.
    STAGES (LOOP only): 1, the walks load the next step into registers while this one
    computes (PREFETCH); N > 1, Triton's software pipeliner stages the next N - 1 steps'
    loads in shared memory (cp.async on sm_80+): more bytes in flight per program without
    registers to hold them.
    HAS_END (reverse): a final-state gradient is given (else it is zero: end_r_ptr unused).
    ATOMIC (reverse): the gradients of the controls and the spectrum (and FUSED gamma) are
    float-atomically added into zeroed [B, L] / [M] buffers instead of stored as partials
    (no reduction launches after the kernel; the sum order varies from run to run).
    MAKE_TABLE (LOOP forward): the program first writes its chunk's rows of the control table
    from eta, delta (every mode tile of the chunk writes the same values), then a CTA barrier
    makes them visible to its walk: no control-table launch before the scan.

    The head ``sync_ptr`` needs no zero fill between launches: the ticket counter holds
    ``ticket0`` when the launch starts (the tickets the launches before it took), and every
    status word holds at most ``status0`` (a launch publishes ``status0`` + 1 or + 2, and the
    host raises ``status0`` by 3 a launch): a word below this launch's ``status0`` + 1 reads
    as not yet published.  A zeroed head takes 0 and 0.
    """
    if M_ALIGN > 1:
        M = M // M_ALIGN * M_ALIGN
    # relaxed: the ticket only orders work; payloads are ordered by the status atomics
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed") - ticket0
    per_chunk = B * n_mtiles
    c = ticket // per_chunk                  # chunk, in scan order (reversed time if REVERSE)
    rest = ticket % per_chunk
    b = rest // n_mtiles
    mt = rest % n_mtiles
    slot = (b * n_mtiles + mt) * n_chunks + c

    lane_t = tl.arange(0, BLOCK_M)                                               # [BLOCK_M]
    lane = mt * BLOCK_M + lane_t
    lane_ok = lane < M
    nu = tl.exp(tl.load(nu_log_ptr + lane, mask=lane_ok, other=0.0).to(tl.float32))
    theta = tl.exp(tl.load(theta_log_ptr + lane, mask=lane_ok, other=0.0).to(tl.float32))
    cos_theta, sin_theta = tl.cos(theta), tl.sin(theta)

    b64 = b.to(tl.int64)
    row_base = b64 * L                        # int64: B L M may exceed 2^31
    state_off = b64 * M + lane                # [BLOCK_M] into [B, M] buffers
    is_last = tl.arange(0, CHUNK) == CHUNK - 1

    if FUSED:
        gamma = tl.load(gamma_ptr + lane, mask=lane_ok, other=0.0)               # [BLOCK_M]
        # the halves of x [B, L, 2M] (one tensor argument per array: the interpreter copies
        # every tensor argument, and overlapping output arguments would overwrite each other)
        x_i_ptr = x_r_ptr + M
    else:
        gamma = nu                                                               # unused

    if MAKE_TABLE:
        t_tab, ok_tab = tile_times(c * (CHUNK * SUB), L, CHUNK * SUB, REVERSE)     # [CHUNK * SUB]
        tok_tab = row_base + t_tab
        store_rows(ctl_ptr, seg_ptr, tok_tab, ok_tab,
                   tl.load(eta_ptr + tok_tab, mask=ok_tab, other=0.0).to(tl.float32),
                   tl.load(delta_ptr + tok_tab, mask=ok_tab, other=0.0).to(tl.float32),
                   HAS_RESETS)
        # the rows just stored are read by other threads of this program (global memory:
        # a CTA barrier orders them)
        tl.debug_barrier()

    # 1. the chunk's map from a zero carry: (P, Q) composed over its tiles (or rows)
    if LOOP:
        agg_pr, agg_pi, agg_qr, agg_qi = walk_summary(
            ctl_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row_base, c, L, M, lane, lane_ok, nu,
            cos_theta, sin_theta, HAS_RESETS, REVERSE, CHUNK * SUB, BLOCK_M, STAGES,
            TABLE=True, PREFETCH=STAGES == 1, FUSED=FUSED, gamma=gamma, h_r_ptr=y_r_ptr,
            h_i_ptr=y_i_ptr, ROWS=ROWS, REBASE=REBASE)
    elif SUB == 1:
        pr, pi, qr, qi, t, valid, tok, off, mask = _tile_maps(
            eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row_base, c * CHUNK, L, M, lane,
            lane_ok, nu, cos_theta, sin_theta, HAS_RESETS, REVERSE, CHUNK)
        agg_pr = _last_row(pr, is_last)                                          # [BLOCK_M]
        agg_pi = _last_row(pi, is_last)
        agg_qr = _last_row(qr, is_last)
        agg_qi = _last_row(qi, is_last)
    else:
        agg_pr = tl.full((BLOCK_M,), 1.0, tl.float32)
        agg_pi = tl.zeros((BLOCK_M,), tl.float32)
        agg_qr = tl.zeros((BLOCK_M,), tl.float32)
        agg_qi = tl.zeros((BLOCK_M,), tl.float32)
        for s in range(SUB):
            spr, spi, sqr, sqi, _t, _v, _tok, _off, _mask = _tile_maps(
                eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row_base, (c * SUB + s) * CHUNK,
                L, M, lane, lane_ok, nu, cos_theta, sin_theta, HAS_RESETS, REVERSE, CHUNK)
            lpr = _last_row(spr, is_last)
            lpi = _last_row(spi, is_last)
            lqr = _last_row(sqr, is_last)
            lqi = _last_row(sqi, is_last)
            # the tile's map after the maps composed so far: (Ps Pa, Ps Qa + Qs)
            nqr, nqi = cmul(lpr, lpi, agg_qr, agg_qi)
            agg_qr = nqr + lqr
            agg_qi = nqi + lqi
            agg_pr, agg_pi = cmul(lpr, lpi, agg_pr, agg_pi)

    flag_ptr = sync_ptr + 1 + slot
    base = carry_ptr + slot.to(tl.int64) * (SLOT_ROWS * BLOCK_M) + lane_t
    if DECOUPLED:
        publish_aggregate = c > 0
    else:
        publish_aggregate = c % window != 0
    if publish_aggregate:
        tl.store(base, agg_pr)
        tl.store(base + BLOCK_M, agg_pi)
        tl.store(base + 2 * BLOCK_M, agg_qr)
        tl.store(base + 3 * BLOCK_M, agg_qi)
        _publish(flag_ptr, status0 + 1)

    # 2. the state entering the chunk: init for chunk 0, else looked back
    # per-lane masks from tensors (the interpreter rejects a tensor & scalar-bool mask)
    c_lanes = tl.zeros((BLOCK_M,), tl.int32) + c                                 # [BLOCK_M]
    first = lane_ok & (c_lanes == 0)
    if REVERSE:
        if HAS_END:
            init_r = tl.load(end_r_ptr + state_off, mask=first, other=0.0).to(tl.float32)
            init_i = tl.load(end_i_ptr + state_off, mask=first, other=0.0).to(tl.float32)
        else:
            init_r = tl.zeros((BLOCK_M,), tl.float32)
            init_i = tl.zeros((BLOCK_M,), tl.float32)
    else:
        if HAS_H0:
            init_r = tl.load(h0_r_ptr + state_off, mask=first, other=0.0).to(tl.float32)
            init_i = tl.load(h0_i_ptr + state_off, mask=first, other=0.0).to(tl.float32)
        else:
            init_r = tl.zeros((BLOCK_M,), tl.float32)
            init_i = tl.zeros((BLOCK_M,), tl.float32)
    carry_r, carry_i = _look_back(sync_ptr, carry_ptr, slot, c, lane_t, init_r, init_i,
                                  status0, BLOCK_M, WIDTH)

    # 3. the inclusive prefix: the state after the chunk
    end_r, end_i = cmul(agg_pr, agg_pi, carry_r, carry_i)
    end_r += agg_qr
    end_i += agg_qi
    if c % window == 0:                       # chunk 0 among them
        tl.store(base + 4 * BLOCK_M, end_r)
        tl.store(base + 5 * BLOCK_M, end_i)
        _publish(flag_ptr, status0 + 2)

    # 4. replay: the state after every row (reverse: the gradients)
    last_chunk = c_lanes == n_chunks - 1                                         # [BLOCK_M]
    if LOOP:
        # forward: the states into y; reverse: grad b into gx, h[t-1] read from the saved y;
        # fused: the layer output / grad x into o
        if FUSED:
            walk_r_ptr, walk_i_ptr = o_ptr, o_ptr + M
        elif REVERSE:
            walk_r_ptr, walk_i_ptr = gx_r_ptr, gx_i_ptr
        else:
            walk_r_ptr, walk_i_ptr = y_r_ptr, y_i_ptr
        nu_part, delta_part, gamma_part = walk_replay(
            ctl_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, walk_r_ptr, walk_i_ptr, y_r_ptr,
            y_i_ptr, h0_r_ptr, h0_i_ptr, gh0_r_ptr, gh0_i_ptr, p_eta_ptr, p_delta_ptr, carry_r,
            carry_i, b, row_base, c, L, M, n_mtiles, mt, lane, lane_ok, nu, cos_theta, sin_theta,
            HAS_RESETS, HAS_H0, REVERSE, ATOMIC, CHUNK * SUB, BLOCK_M, STAGES, TABLE=True,
            PREFETCH=STAGES == 1, FUSED=FUSED, gamma=gamma, SAVE_H=SAVE_H, xw_ptr=xw_ptr,
            ROWS=ROWS, REBASE=REBASE)                                          # [BLOCK_M] each
        theta_part = delta_part * theta
    elif SUB == 1:
        _, _, nu_part, theta_part = _replay(
            pr, pi, qr, qi, carry_r, carry_i, t, valid, tok, off, mask, eta_ptr, delta_ptr,
            seg_ptr, y_r_ptr, y_i_ptr, h0_r_ptr, h0_i_ptr, gx_r_ptr, gx_i_ptr, gh0_r_ptr,
            gh0_i_ptr, p_eta_ptr, p_delta_ptr, row_base, state_off, lane_ok, last_chunk, M, mt,
            n_mtiles, nu, theta, cos_theta, sin_theta, HAS_RESETS, HAS_H0, REVERSE, CHUNK,
            ATOMIC)
    else:
        nu_part = tl.zeros((BLOCK_M,), tl.float32)
        theta_part = tl.zeros((BLOCK_M,), tl.float32)
        for s in range(SUB):
            spr, spi, sqr, sqi, st, svalid, stok, soff, smask = _tile_maps(
                eta_ptr, delta_ptr, seg_ptr, x_r_ptr, x_i_ptr, row_base, (c * SUB + s) * CHUNK,
                L, M, lane, lane_ok, nu, cos_theta, sin_theta, HAS_RESETS, REVERSE, CHUNK)
            carry_r, carry_i, dn, dt = _replay(
                spr, spi, sqr, sqi, carry_r, carry_i, st, svalid, stok, soff, smask, eta_ptr,
                delta_ptr, seg_ptr, y_r_ptr, y_i_ptr, h0_r_ptr, h0_i_ptr, gx_r_ptr, gx_i_ptr,
                gh0_r_ptr, gh0_i_ptr, p_eta_ptr, p_delta_ptr, row_base, state_off, lane_ok,
                last_chunk, M, mt, n_mtiles, nu, theta, cos_theta, sin_theta, HAS_RESETS,
                HAS_H0, REVERSE, CHUNK, ATOMIC)
            nu_part += dn
            theta_part += dt
    if REVERSE:
        if ATOMIC:
            spec_off = lane
            tl.atomic_add(p_nu_ptr + spec_off, nu_part, mask=lane_ok)
            tl.atomic_add(p_theta_ptr + spec_off, theta_part, mask=lane_ok)
            if FUSED:
                tl.atomic_add(p_gamma_ptr + spec_off, gamma_part, mask=lane_ok)
        else:
            spec_off = (b64 * n_chunks + c) * M + lane
            tl.store(p_nu_ptr + spec_off, nu_part, mask=lane_ok)
            tl.store(p_theta_ptr + spec_off, theta_part, mask=lane_ok)
            if FUSED:
                tl.store(p_gamma_ptr + spec_off, gamma_part, mask=lane_ok)
    else:
        tl.store(end_r_ptr + state_off, end_r, mask=lane_ok & last_chunk)
        tl.store(end_i_ptr + state_off, end_i, mask=lane_ok & last_chunk)
