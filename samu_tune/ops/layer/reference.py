"""The SAMU layer in plain torch, float64-capable: ground truth for the layer and decode tests.

For ``x: [B, L, 2M]`` and parameters (:class:`SAMUParams`), with ``xa = [x, 1]`` ([B, L, 2M+1],
the trailing 1 a bias coordinate) and each direction normalised to unit norm::

    q_p = xa . d_p / max(|d_p|, 1e-12)        q_r = xa . d_r / max(|d_r|, 1e-12)     [B, L]
    delta = tanh(a_p) * tanh(q_p) / sqrt(M)
    eta   = tanh(a_r) * r / (1 + r^2) / sqrt(M),   r = tanh(q_r)
    gamma = sqrt(1 - exp(-2 nu)) + 1e-8,          nu = exp(nu_log)                      [M]
    br + i bi = (x[..., :M] + i x[..., M:]) * gamma        (stored in x's dtype)
    h = scan(eta, delta, nu_log, theta_log, br, bi)      (samu_tune.ops.scan.reference)
    y = relu(cat(Re h, Im h))                              [B, L, 2M] in x's dtype

The write is rounded to x's dtype before the scan, as in the seed's canonical PyTorch path
(``br = (x[..., :M].float() * gamma).to(x.dtype)``).  Arithmetic is float64 when x or any
parameter is float64, else float32.  One decode step is the layer on a single token.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from samu_tune.ops.scan.reference import scan_reference

State = tuple[torch.Tensor, torch.Tensor]


class SAMUParams(NamedTuple):
    """The parameters of a SAMU layer of M modes.

    phase_direction, radial_direction: [2M+1] (the last entry multiplies the bias coordinate);
    phase_amplitude, radial_amplitude: scalars (0-d); nu_log, theta_log: [M].
    """

    phase_direction: torch.Tensor
    radial_direction: torch.Tensor
    phase_amplitude: torch.Tensor
    radial_amplitude: torch.Tensor
    nu_log: torch.Tensor
    theta_log: torch.Tensor

    @property
    def modes(self) -> int:
        return self.nu_log.shape[0]

    def to(self, dtype: torch.dtype) -> "SAMUParams":
        return SAMUParams(*(p.to(dtype) for p in self))


def compute_dtype(x: torch.Tensor, params: SAMUParams) -> torch.dtype:
    if x.dtype == torch.float64 or any(p.dtype == torch.float64 for p in params):
        return torch.float64
    return torch.float32


def needs_grad(x: torch.Tensor, params: SAMUParams, state: Optional[State]) -> bool:
    """Whether a layer or decode call on ``x`` builds an autograd graph: grad mode is on and
    x, a parameter or the state requires grad."""
    if not torch.is_grad_enabled():
        return False
    return x.requires_grad or any(t.requires_grad for t in params) or (
        state is not None and any(t.requires_grad for t in state))


def write_gamma(nu_log: torch.Tensor) -> torch.Tensor:
    """gamma = sqrt(1 - exp(-2 exp(nu_log))) + 1e-8, [M]: the stationary write normalisation."""
    nu = torch.exp(nu_log)
    return torch.sqrt(1.0 - torch.exp(-2.0 * nu)) + 1.0e-8


def controller_reference(x: torch.Tensor, params: SAMUParams, *,
                         dtype: Optional[torch.dtype] = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(eta, delta, br, bi): controls [..., ] in the arithmetic dtype, writes [..., M] in x's dtype.

    ``x`` is [..., 2M]; the formula is in the module docstring.
    """
    cd = dtype or compute_dtype(x, params)
    M = params.modes
    if x.shape[-1] != 2 * M:
        raise ValueError(f"x must have last dimension 2M = {2 * M}, got {list(x.shape)}")
    xc = x.to(cd)
    xa = torch.cat([xc, torch.ones_like(xc[..., :1])], dim=-1)               # [..., 2M+1]

    def unit(d: torch.Tensor) -> torch.Tensor:
        d = d.to(cd)
        return d / torch.linalg.vector_norm(d).clamp_min(1e-12)

    q_p = xa @ unit(params.phase_direction)                                  # [...]
    q_r = xa @ unit(params.radial_direction)
    scale = 1.0 / math.sqrt(M)
    delta = torch.tanh(params.phase_amplitude.to(cd)) * torch.tanh(q_p) * scale
    r = torch.tanh(q_r)
    eta = torch.tanh(params.radial_amplitude.to(cd)) * r / (1.0 + r * r) * scale
    gamma = write_gamma(params.nu_log.to(cd))
    br = (xc[..., :M] * gamma).to(x.dtype)
    bi = (xc[..., M:] * gamma).to(x.dtype)
    return eta, delta, br, bi


def layer_reference(x: torch.Tensor, params: SAMUParams, *,
                    initial_state: Optional[State] = None,
                    segment_pos: Optional[torch.Tensor] = None,
                    dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, State]:
    """The whole layer, step by step: ``(y [B, L, 2M] in x's dtype, final state (h_r, h_i) [B, M])``.

    ``initial_state`` (h0_r, h0_i) [B, M]; ``segment_pos`` [B, L] integer, 0 starts a sequence
    (the transition there is 0).  The final state is in the arithmetic dtype.
    """
    cd = dtype or compute_dtype(x, params)
    eta, delta, br, bi = controller_reference(x, params, dtype=cd)
    out = scan_reference(eta, delta, params.nu_log, params.theta_log, br, bi,
                         initial_state=initial_state, segment_pos=segment_pos,
                         output_final_state=True, dtype=cd)
    y = torch.relu(torch.cat([out.real, out.imag], dim=-1)).to(x.dtype)
    return y, out.final_state


def step_reference(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None, *,
                   dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, State]:
    """One decode step: ``x [B, 2M]``, state (h_r, h_i) [B, M] or None (zeros).

    Returns ``(y [B, 2M] in x's dtype, new state [B, M])``: the layer on one token.
    """
    if x.ndim != 2:
        raise ValueError(f"x must have shape [B, 2M], got {list(x.shape)}")
    y, new_state = layer_reference(x[:, None], params, initial_state=state, dtype=dtype)
    return y[:, 0], new_state
