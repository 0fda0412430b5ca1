"""The radial decay of every (token, mode), computed in one parallel pass.

    rho[b, t, m] = exp(-nu[m] e^{eta[b, t]}),   nu = exp(nu_log)          [B, L, M] fp32

The serial walk with PRECOMPUTED=True then reads rho instead of evaluating an exponential per
(token, mode) on its critical path.  Resets are not applied here (the walk applies them).
"""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["rows", "M"])
def radial_decay(eta_ptr, nu_log_ptr, rho_ptr, rows, M,
                 BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
    """One [BLOCK_R, BLOCK_M] tile of rho per program; rows = B L flattened tokens.

    Grid: (cdiv(rows, BLOCK_R), cdiv(M, BLOCK_M)).
    """
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)          # [BLOCK_R]
    lane = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)                    # [BLOCK_M]
    row_ok = r < rows
    lane_ok = lane < M
    e = tl.exp(tl.load(eta_ptr + r, mask=row_ok, other=0.0).to(tl.float32))      # [BLOCK_R]
    nu = tl.exp(tl.load(nu_log_ptr + lane, mask=lane_ok, other=0.0).to(tl.float32))
    rho = tl.exp(-nu[None, :] * e[:, None])                                      # [BLOCK_R, BLOCK_M]
    tl.store(rho_ptr + r[:, None] * M + lane[None, :], rho,
             mask=row_ok[:, None] & lane_ok[None, :])
