"""Per-token control scalars, written once per token before a scan walks the tokens.

    table[b L + t] = (e^{eta[b, t]}, cos delta[b, t], sin delta[b, t], 0)      [B L, 4] fp32

with (cos, sin) = (0, 0) where a reset starts a sequence (seg == 0), so that the transition
A[t] = exp(-nu e^eta) (cos + i sin)(theta + delta) built from a row is 0 there (its gradients
are then 0 too, as with the walk's own reset masking).  A walk that reads a row instead of
evaluating exp/cos/sin per (token, thread) has no libdevice trig (with its rarely taken
range-reduction loop) on its critical path: three uniform loads (one 16-byte sector), and
nothing in the way of issuing a later row's loads early.  Written by the look-back scan's
forward kernel for its own chunk (MAKE_TABLE, :mod:`samu_tune.kernels.lookback`) or by the
SAMU controller kernel as it computes the controls (:mod:`samu_tune.kernels.controller`).
"""
import triton
import triton.language as tl

# fp32 columns per token (3 used; 4 keeps a token's row in one aligned 16-byte sector)
TABLE_COLS = tl.constexpr(4)


@triton.jit
def store_rows(table_ptr, seg_ptr, tok, ok, eta, delta, HAS_RESETS: tl.constexpr):
    """Write the table rows of tokens ``tok`` (masked by ``ok``) from their fp32 eta, delta
    (all [BLOCK])."""
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
