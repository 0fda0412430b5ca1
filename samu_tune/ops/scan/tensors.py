"""The tensors of one scan call: :class:`ScanInputs` in, :class:`ScanOutput` out."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple, Optional

import torch


class ScanOutput(NamedTuple):
    """``real``, ``imag``: [B, L, M] in br's dtype; ``final_state``: None or fp32 (h_r, h_i) [B, M]."""

    real: torch.Tensor
    imag: torch.Tensor
    final_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None


@dataclass(frozen=True)
class ScanInputs:
    """Validated, contiguous inputs of :func:`samu_tune.scan`.

    eta, delta: [B, L]; nu_log, theta_log: [M]; br, bi: [B, L, M];
    initial_state: None or (h0_r, h0_i) each [B, M]; segment_pos: None or integer [B, L].
    """

    eta: torch.Tensor
    delta: torch.Tensor
    nu_log: torch.Tensor
    theta_log: torch.Tensor
    br: torch.Tensor
    bi: torch.Tensor
    initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    segment_pos: Optional[torch.Tensor] = None
    output_final_state: bool = False

    @property
    def shape(self) -> tuple[int, int, int]:
        B, L, M = self.br.shape
        return B, L, M

    def differentiable(self) -> tuple[torch.Tensor, ...]:
        """The tensors gradients can flow to, in a fixed order."""
        h0 = self.initial_state or ()
        return (self.eta, self.delta, self.nu_log, self.theta_log, self.br, self.bi, *h0)

    def replace(self, **changes) -> "ScanInputs":
        return replace(self, **changes)
