"""Prefixes over chunk summaries: the carry-in of every chunk from the chunks' maps.

Chunk c of row b has the map z -> P[c] z + Q[c] ([B, n_chunks, M] fp32, in scan order, from
:func:`samu_tune.kernels.chunk.chunk_summary`).  The carry-in of chunk c is

    carry[0] = init,   carry[c + 1] = P[c] carry[c] + Q[c]

with init = h0 or 0 in the forward scan and the final-state gradient in the backward scan,
and ``end`` = the state after the last chunk (the forward final state).  Summaries are
already in scan order, so the prefix does not depend on the direction: the caller picks
``HAS_INIT`` and ``WRITE_END``.  Three variants:

- :func:`prefix_serial`: a program per (row, mode tile) walks the chunks (flat serial).
- :func:`prefix_blocked`: the same program walks blocks of BLOCK_C chunks, each block a
  log-depth ``tl.associative_scan`` (Hillis-Steele) of its summaries (``hierarchical``).
- :func:`group_scan`: one block per (row, group, mode tile) in parallel: the group's
  summary (EXPAND=False) or, from the group's carry-in, its chunks' carries (EXPAND=True);
  with :func:`prefix_serial` over the group summaries in between this is ``grouped``'s
  three-level prefix.

M, n_chunks (and groups) are runtime values.
"""
import triton
import triton.language as tl

from samu_tune.kernels.complex_math import load_pair
from samu_tune.kernels.tile import affine_combine


@triton.jit
def _block(p_r_ptr, p_i_ptr, q_r_ptr, q_i_ptr, base, c0, stop, M, lane, mask,
           BLOCK_C: tl.constexpr):
    """Inclusive scan of the maps of chunks c0 .. c0 + BLOCK_C - 1 (those < stop; the rest are
    identity): (Pr, Pi, Qr, Qi, cs, offs), [BLOCK_C, BLOCK_M] each, cs [BLOCK_C].  ``base`` is
    the row's first summary index (int64)."""
    cs = c0 + tl.arange(0, BLOCK_C)                                                   # [BLOCK_C]
    inside = (cs < stop)[:, None] & mask[None, :]                     # [BLOCK_C, BLOCK_M]
    offs = (base + cs)[:, None] * M + lane[None, :]
    pr = tl.load(p_r_ptr + offs, mask=inside, other=1.0)
    pi = tl.load(p_i_ptr + offs, mask=inside, other=0.0)
    qr = tl.load(q_r_ptr + offs, mask=inside, other=0.0)
    qi = tl.load(q_i_ptr + offs, mask=inside, other=0.0)
    pr, pi, qr, qi = tl.associative_scan((pr, pi, qr, qi), 0, affine_combine)
    return pr, pi, qr, qi, cs, offs


@triton.jit
def _expand(carry_r_ptr, carry_i_ptr, pr, pi, qr, qi, cs, offs, stop, M, mask, zr, zi,
            BLOCK_C: tl.constexpr):
    """Write the carries of a scanned block entering with state z; return the state after it.

    carry[c0] = z, carry[c + 1] = P[c] z + Q[c] inside the block (the carry after its last
    chunk belongs to whoever holds the next block).
    """
    hr = pr * zr[None, :] - pi * zi[None, :] + qr                     # [BLOCK_C, BLOCK_M]
    hi = pr * zi[None, :] + pi * zr[None, :] + qi
    rows = tl.arange(0, BLOCK_C)
    nxt = ((rows < BLOCK_C - 1) & (cs + 1 < stop))[:, None] & mask[None, :]
    tl.store(carry_r_ptr + offs + M, hr, mask=nxt)
    tl.store(carry_i_ptr + offs + M, hi, mask=nxt)
    first = (rows == 0)[:, None] & mask[None, :]
    tl.store(carry_r_ptr + offs, tl.zeros_like(hr) + zr[None, :], mask=first)
    tl.store(carry_i_ptr + offs, tl.zeros_like(hi) + zi[None, :], mask=first)
    last = (rows == BLOCK_C - 1)[:, None]
    return tl.sum(tl.where(last, hr, 0.0), axis=0), tl.sum(tl.where(last, hi, 0.0), axis=0)


@triton.jit(do_not_specialize=["M", "n_chunks"])
def prefix_serial(
    p_r_ptr, p_i_ptr, q_r_ptr, q_i_ptr,   # chunk maps  [B, n_chunks, M] f32
    init_r_ptr, init_i_ptr,               # carry into chunk 0 (HAS_INIT)  [B, M]
    carry_r_ptr, carry_i_ptr,             # carry into each chunk (written)  [B, n_chunks, M] f32
    end_r_ptr, end_i_ptr,                 # state after the last chunk (WRITE_END)  [B, M] f32
    M, n_chunks,
    HAS_INIT: tl.constexpr, WRITE_END: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Program (row b, mode tile): z = init; for each chunk: carry[c] = z; z = P[c] z + Q[c].

    The loads do not depend on z: unrolled 4 times, four chunks' loads are in flight at once.
    """
    n_mblocks = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    b = (pid // n_mblocks).to(tl.int64)
    lane = (pid % n_mblocks) * BLOCK_M + tl.arange(0, BLOCK_M)                        # [BLOCK_M]
    mask = lane < M
    soff = b * M + lane
    zr, zi = load_pair(init_r_ptr, init_i_ptr, soff, mask, HAS_INIT, BLOCK_M)
    for c in tl.range(0, n_chunks, loop_unroll_factor=4):
        off = (b * n_chunks + c) * M + lane
        tl.store(carry_r_ptr + off, zr, mask=mask)
        tl.store(carry_i_ptr + off, zi, mask=mask)
        pr = tl.load(p_r_ptr + off, mask=mask, other=1.0)
        pi = tl.load(p_i_ptr + off, mask=mask, other=0.0)
        qr = tl.load(q_r_ptr + off, mask=mask, other=0.0)
        qi = tl.load(q_i_ptr + off, mask=mask, other=0.0)
        zr, zi = pr * zr - pi * zi + qr, pr * zi + pi * zr + qi
    if WRITE_END:
        tl.store(end_r_ptr + soff, zr, mask=mask)
        tl.store(end_i_ptr + soff, zi, mask=mask)


@triton.jit(do_not_specialize=["M", "n_chunks"])
def prefix_blocked(
    p_r_ptr, p_i_ptr, q_r_ptr, q_i_ptr,   # chunk maps  [B, n_chunks, M] f32
    init_r_ptr, init_i_ptr,               # carry into chunk 0 (HAS_INIT)  [B, M]
    carry_r_ptr, carry_i_ptr,             # carry into each chunk (written)  [B, n_chunks, M] f32
    end_r_ptr, end_i_ptr,                 # state after the last chunk (WRITE_END)  [B, M] f32
    M, n_chunks,
    HAS_INIT: tl.constexpr, WRITE_END: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Program (row b, mode tile): a serial loop over blocks of BLOCK_C chunks, each block's
    prefix a log-depth scan of its [BLOCK_C, BLOCK_M] summaries."""
    n_mblocks = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    b = (pid // n_mblocks).to(tl.int64)
    lane = (pid % n_mblocks) * BLOCK_M + tl.arange(0, BLOCK_M)                        # [BLOCK_M]
    mask = lane < M
    soff = b * M + lane
    zr, zi = load_pair(init_r_ptr, init_i_ptr, soff, mask, HAS_INIT, BLOCK_M)
    base = b * n_chunks
    for c0 in range(0, n_chunks, BLOCK_C):
        pr, pi, qr, qi, cs, offs = _block(p_r_ptr, p_i_ptr, q_r_ptr, q_i_ptr, base, c0,
                                          n_chunks, M, lane, mask, BLOCK_C)
        zr, zi = _expand(carry_r_ptr, carry_i_ptr, pr, pi, qr, qi, cs, offs, n_chunks, M,
                         mask, zr, zi, BLOCK_C)
    if WRITE_END:
        tl.store(end_r_ptr + soff, zr, mask=mask)
        tl.store(end_i_ptr + soff, zi, mask=mask)


@triton.jit(do_not_specialize=["M", "n_chunks", "n_groups"])
def group_scan(
    p_r_ptr, p_i_ptr, q_r_ptr, q_i_ptr,       # chunk maps  [B, n_chunks, M] f32
    gp_r_ptr, gp_i_ptr, gq_r_ptr, gq_i_ptr,   # group maps (written if not EXPAND)  [B, ng, M] f32
    gc_r_ptr, gc_i_ptr,                       # carry into each group (EXPAND)  [B, n_groups, M] f32
    carry_r_ptr, carry_i_ptr,                 # carry into each chunk (if EXPAND)  [B, nc, M] f32
    M, n_chunks, n_groups,
    EXPAND: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Program (row b, group g, mode tile), grid (B * n_groups * n_mblocks,): scan the GROUP
    chunk maps of group g; store their composition (EXPAND=False) or, from the group's
    carry-in, every chunk's carry-in (EXPAND=True)."""
    n_mblocks = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    bg = (pid // n_mblocks).to(tl.int64)
    b = bg // n_groups
    g = (bg % n_groups).to(tl.int32)
    lane = (pid % n_mblocks) * BLOCK_M + tl.arange(0, BLOCK_M)                        # [BLOCK_M]
    mask = lane < M
    c0 = g * GROUP
    stop = tl.minimum(n_chunks, c0 + GROUP)
    pr, pi, qr, qi, cs, offs = _block(p_r_ptr, p_i_ptr, q_r_ptr, q_i_ptr, b * n_chunks, c0,
                                      stop, M, lane, mask, GROUP)
    goff = bg * M + lane
    if EXPAND:
        zr = tl.load(gc_r_ptr + goff, mask=mask, other=0.0)
        zi = tl.load(gc_i_ptr + goff, mask=mask, other=0.0)
        _expand(carry_r_ptr, carry_i_ptr, pr, pi, qr, qi, cs, offs, stop, M, mask, zr, zi,
                GROUP)
    else:
        # the last row composes the whole group (rows past ``stop`` are identity)
        last = (tl.arange(0, GROUP) == GROUP - 1)[:, None] & mask[None, :]
        full = tl.zeros([GROUP, 1], tl.int64) + goff[None, :]
        tl.store(gp_r_ptr + full, pr, mask=last)
        tl.store(gp_i_ptr + full, pi, mask=last)
        tl.store(gq_r_ptr + full, qr, mask=last)
        tl.store(gq_i_ptr + full, qi, mask=last)
