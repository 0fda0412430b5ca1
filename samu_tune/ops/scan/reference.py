"""The SAMU scan in plain torch: ground truth for tests and the tuner, and the CPU fallback.

Per batch row b, time t, mode m::

    nu[m]    = exp(nu_log[m])             theta[m] = exp(theta_log[m])
    A[b,t,m] = exp(-nu[m] * exp(eta[b,t])) * exp(i * (theta[m] + delta[b,t]))
    A[b,t,m] = 0                           where segment_pos[b,t] == 0 (a sequence starts)
    h[b,t,m] = A[b,t,m] * h[b,t-1,m] + (br[b,t,m] + i * bi[b,t,m]),   h[b,-1] = h0[b] or 0

Shapes: eta, delta [B, L]; nu_log, theta_log [M]; br, bi [B, L, M]; h0 (h0_r, h0_i) [B, M].
Arithmetic is float64 when any input is float64, else float32; outputs are stored in br's
dtype and the final state in the arithmetic dtype.  Everything is differentiable by autograd.
"""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune.ops.scan.tensors import ScanOutput


def _compute_dtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def transition(eta: torch.Tensor, delta: torch.Tensor, nu_log: torch.Tensor,
               theta_log: torch.Tensor, segment_pos: Optional[torch.Tensor] = None,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A as (real, imag), each [B, L, M] in ``dtype`` (materialised: reference use only)."""
    nu = torch.exp(nu_log.to(dtype))
    theta = torch.exp(theta_log.to(dtype))
    radius = torch.exp(-nu * torch.exp(eta.to(dtype))[..., None])       # [B, L, M]
    angle = theta + delta.to(dtype)[..., None]                           # [B, L, M]
    ar, ai = radius * torch.cos(angle), radius * torch.sin(angle)
    if segment_pos is not None:
        keep = (segment_pos != 0)[..., None].to(dtype)
        ar, ai = ar * keep, ai * keep
    return ar, ai


def scan_reference(eta: torch.Tensor, delta: torch.Tensor, nu_log: torch.Tensor,
                   theta_log: torch.Tensor, br: torch.Tensor, bi: torch.Tensor, *,
                   initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                   segment_pos: Optional[torch.Tensor] = None,
                   output_final_state: bool = False,
                   dtype: Optional[torch.dtype] = None) -> ScanOutput:
    """Run the recurrence above step by step; ``dtype`` overrides the arithmetic dtype."""
    h0 = initial_state or (None, None)
    dtype = dtype or _compute_dtype(eta, delta, nu_log, theta_log, br, bi, *h0)
    ar, ai = transition(eta, delta, nu_log, theta_log, segment_pos, dtype)
    wr, wi = br.to(dtype), bi.to(dtype)
    B, L, M = br.shape
    if initial_state is not None:
        hr, hi = initial_state[0].to(dtype), initial_state[1].to(dtype)
    else:
        hr = torch.zeros(B, M, dtype=dtype, device=br.device)
        hi = torch.zeros_like(hr)
    if not (B and L and M):
        # empty: outputs and final state new tensors in the graph of every input; with L = 0
        # the state passes through
        return ScanOutput((wr + 0 * ar).to(br.dtype), (wi + 0 * ai).to(bi.dtype),
                          (hr + 0, hi + 0) if output_final_state else None)
    outs_r, outs_i = [], []
    for t in range(L):
        a_r, a_i = ar[:, t], ai[:, t]
        hr, hi = a_r * hr - a_i * hi + wr[:, t], a_i * hr + a_r * hi + wi[:, t]
        outs_r.append(hr)
        outs_i.append(hi)
    out_r = torch.stack(outs_r, dim=1).to(br.dtype)
    out_i = torch.stack(outs_i, dim=1).to(br.dtype)
    return ScanOutput(out_r, out_i, (hr, hi) if output_final_state else None)
