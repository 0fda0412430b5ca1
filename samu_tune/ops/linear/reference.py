"""``h[t] = a[t] h[t-1] + b[t]`` as a torch loop: the ``reference`` strategy of the generic
scans (any device, float64, autograd through torch)."""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune.ops.linear.launch import Pair


def linear_scan_reference(a: Pair, b: Pair, h0: Optional[Pair], *, reverse: bool = False
                          ) -> tuple[Pair, Pair]:
    """(outputs [B, L, D] in b's dtype, final state [B, D] in the arithmetic dtype).

    Arithmetic is float64 when any input is float64, else float32.  ``reverse`` scans from
    t = L-1 down to 0 (``h[t] = a[t] h[t+1] + b[t]``, h0 enters at t = L-1).
    """
    tensors = [t for p in (a, b, h0) if p is not None for t in p if t is not None]
    cd = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    complex_ = a.is_complex
    B, L, D = a.r.shape

    def as_complex(p: Pair) -> torch.Tensor:
        if complex_:
            return torch.complex(p.r.to(cd), p.i.to(cd))
        return p.r.to(cd)

    av, bv = as_complex(a), as_complex(b)
    h = as_complex(h0) if h0 is not None else torch.zeros(B, D, dtype=av.dtype, device=av.device)
    if not (B and L and D):
        # empty: outputs and final state new tensors in the graph of a and b (and h0); with
        # L = 0 the state passes through
        out, h = bv + 0 * av, h + 0
    else:
        outs = [None] * L
        for t in (range(L - 1, -1, -1) if reverse else range(L)):
            h = av[:, t] * h + bv[:, t]
            outs[t] = h
        out = torch.stack(outs, dim=1)
    if complex_:
        return (Pair(out.real.to(b.r.dtype), out.imag.to(b.r.dtype)), Pair(h.real, h.imag))
    return Pair(out.to(b.r.dtype)), Pair(h)
