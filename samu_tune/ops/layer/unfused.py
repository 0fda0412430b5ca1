"""The SAMU layer's unfused path: controller and write in torch, the scan from the registry
(:func:`samu_tune.scan`, through :mod:`samu_tune.ops.layer.varlen` for ``cu_seqlens``), ReLU in
torch.  Differentiable everywhere the scan is; the reference for the fused path's rounding."""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune.ops.layer import controller, varlen
from samu_tune.ops.layer.reference import SAMUParams, State


def forward(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None,
            segment_pos: Optional[torch.Tensor] = None, *,
            cu_seqlens: Optional[torch.Tensor] = None,
            scan_strategy="auto") -> tuple[torch.Tensor, State]:
    """``x [B, L, 2M] -> (y = relu(cat(Re h, Im h)) [B, L, 2M] in x's dtype, final state)``."""
    eta, delta = controller.controls(x, params)
    br, bi = controller.writes(x, params)
    out = varlen.scan(eta, delta, params.nu_log, params.theta_log, br, bi,
                      initial_state=state, segment_pos=segment_pos, cu_seqlens=cu_seqlens,
                      output_final_state=True, strategy=scan_strategy)
    return torch.relu(torch.cat([out.real, out.imag], dim=-1)), out.final_state
