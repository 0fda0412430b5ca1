"""Per-token control scalars, computed once before a scan walks the tokens.

    table[b L + t] = (e^{eta[b, t]}, cos delta[b, t], sin delta[b, t], 0)      [B L, 4] fp32

with (cos, sin) = (0, 0) where a reset starts a sequence (seg == 0), so that the transition
A[t] = exp(-nu e^eta) (cos + i sin)(theta + delta) built from a row is 0 there (its gradients
are then 0 too, as with the walk's own reset masking).  A walk that reads a row instead of
evaluating exp/cos/sin per (token, thread) has no libdevice trig (with its rarely taken
range-reduction loop) on its critical path: three uniform loads (one 16-byte sector), and
nothing in the way of issuing a later row's loads early.
"""
import triton
import triton.language as tl

# fp32 columns per token (3 used; 4 keeps a token's row in one aligned 16-byte sector)
TABLE_COLS = tl.constexpr(4)


@triton.jit(do_not_specialize=["rows"])
def control_table(eta_ptr, delta_ptr, seg_ptr, table_ptr, rows,
                  HAS_RESETS: tl.constexpr, BLOCK: tl.constexpr):
    """One [BLOCK] range of the B L flattened tokens per program; grid (cdiv(rows, BLOCK),)."""
    tok = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)             # [BLOCK]
    ok = tok < rows
    eta = tl.load(eta_ptr + tok, mask=ok, other=0.0).to(tl.float32)
    delta = tl.load(delta_ptr + tok, mask=ok, other=0.0).to(tl.float32)
    store_rows(table_ptr, seg_ptr, tok, ok, eta, delta, HAS_RESETS)


@triton.jit
def store_rows(table_ptr, seg_ptr, tok, ok, eta, delta, HAS_RESETS: tl.constexpr):
    """Write the table rows of tokens ``tok`` (masked by ``ok``) from their fp32 eta, delta
    (all [BLOCK]); shared with the controller kernel, which writes the table as it computes
    the controls (:mod:`samu_tune.kernels.controller`)."""
    e = tl.exp(eta)
    cd, sd = tl.cos(delta), tl.sin(delta)
    if HAS_RESETS:
        keep = tl.load(seg_ptr + tok, mask=ok, other=1) != 0
        cd = tl.where(keep, cd, 0.0)
        sd = tl.where(keep, sd, 0.0)
    row = table_ptr + tok * TABLE_COLS
    tl.store(row, e, mask=ok)
    tl.store(row + 1, cd, mask=ok)
    tl.store(row + 2, sd, mask=ok)
    tl.store(row + 3, tl.zeros_like(e), mask=ok)
