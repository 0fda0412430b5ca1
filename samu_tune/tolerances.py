"""One tolerance table, shared by the tests and the tuner's verification.

Errors are relative in norm: ``|got - want| / |want|`` with ``want`` computed in float64 from
the same (already rounded) inputs.  The forward error comes from storing outputs in the
output dtype; gradient errors also from the kernels reading those rounded outputs back.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch


class Tolerance(NamedTuple):
    forward: float
    gradient: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-9, 1e-8),
    "float32": Tolerance(1e-4, 1e-3),
    "float16": Tolerance(5e-3, 3e-2),
    "bfloat16": Tolerance(2e-2, 6e-2),
}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` in float64; NaN/inf anywhere gives ``inf``."""
    got64, want64 = got.detach().double().cpu(), want.detach().double().cpu()
    if not bool(torch.isfinite(got64).all()):
        return math.inf
    scale = float(want64.norm())
    diff = float((got64 - want64).norm())
    return diff / scale if scale > 0 else diff


def check(name: str, got: Optional[torch.Tensor], want: Optional[torch.Tensor], tol: float
          ) -> Optional[str]:
    """None when ``got`` matches ``want`` within ``tol``, else a one-line reason."""
    if want is None and got is None:
        return None
    if got is None:
        return f"{name}: missing (expected a tensor)"
    if want is None:
        want = torch.zeros_like(got)
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {list(got.shape)} != expected {list(want.shape)}"
    err = relative_error(got, want)
    if not err <= tol:
        return f"{name}: relative error {err:.3g} > {tol:.1g}"
    return None


def check_all(got: dict, want: dict, dtype: str, *, state_prefix: str = "final"
              ) -> Optional[str]:
    """None when every entry of ``want`` (name -> tensor or None) matches ``got[name]`` within
    ``TOLERANCES[dtype]``, else the reasons joined by "; ".  ``grad_*`` entries use the
    gradient tolerance, the others the forward one; final states (names starting with
    ``state_prefix``, kept in fp32) at least the float32 forward tolerance."""
    tol = TOLERANCES[dtype]
    reasons = []
    for name, w in want.items():
        limit = tol.gradient if name.startswith("grad_") else tol.forward
        if name.startswith(state_prefix) and w is not None:
            limit = max(limit, TOLERANCES["float32"].forward)
        reason = check(name, got.get(name), w, limit)
        if reason:
            reasons.append(reason)
    return "; ".join(reasons) if reasons else None
