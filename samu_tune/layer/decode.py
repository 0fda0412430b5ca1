"""One SAMU decode step on the GPU: ``decode_step(x [B, 2M], params, state) -> (y, state)``.

Strategies (all compute :func:`samu_tune.layer.reference.step_reference`):

- ``single``: one program per batch row walks all mode tiles (the seed's ``samu_decode``);
  one launch, best when B alone fills the GPU.
- ``blocked``: one program per (mode tile, row) (the seed's ``samu_decode_blocked``); each
  recomputes the row's controller, so small B still spreads over many SMs.
- ``reference``: torch (any device, float64, differentiable).

``"auto"`` takes ``reference`` on a plain CPU, for float64, or when gradients are needed;
otherwise ``blocked`` for ``B < BLOCKED_BELOW_B`` rows (and more than one mode tile), else
``single``.  This rule is a placeholder until decode is tuned like the scan.
"""
from __future__ import annotations

import math
from typing import Literal, Optional, Union

import torch
import triton
from pydantic import BaseModel, ConfigDict

from ..settings import settings
from ..strategies._alloc import empty
from .reference import SAMUParams, State, step_reference

DecodeName = Literal["single", "blocked", "reference"]
BLOCKED_BELOW_B = 32


class DecodeConfig(BaseModel):
    """Launch choices of the decode kernels (the config space of a future tuner)."""

    model_config = ConfigDict(frozen=True)

    block_m: Literal[16, 32, 64, 128, 256] = 64
    block_d: Literal[64, 128, 256, 512, 1024] = 512
    num_warps: Literal[1, 2, 4, 8] = 4


def default_config(name: str, M: int) -> DecodeConfig:
    cap = 256 if name == "single" else 64
    block_m = max(16, min(cap, triton.next_power_of_2(M)))
    block_d = max(64, min(1024, triton.next_power_of_2(2 * M + 1)))
    return DecodeConfig(block_m=block_m, block_d=block_d, num_warps=8 if block_d >= 512 else 4)


def kernels_available(x: torch.Tensor) -> bool:
    """Triton can run on x's device: CUDA, or the CPU under TRITON_INTERPRET=1."""
    return x.is_cuda or (x.device.type == "cpu" and settings().interpret)


def _needs_grad(x: torch.Tensor, params: SAMUParams, state: Optional[State]) -> bool:
    tensors = [x, *params, *(state or ())]
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def choose(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None) -> DecodeName:
    """The strategy ``"auto"`` runs (see the module docstring)."""
    if (not kernels_available(x) or _needs_grad(x, params, state)
            or x.dtype == torch.float64 or any(p.dtype == torch.float64 for p in params)):
        return "reference"
    B, M = x.shape[0], params.modes
    tiles = triton.cdiv(M, default_config("blocked", M).block_m)
    return "blocked" if B < BLOCKED_BELOW_B and tiles > 1 else "single"


def _check(x: torch.Tensor, params: SAMUParams, state: Optional[State]) -> None:
    M = params.modes
    if x.ndim != 2 or x.shape[1] != 2 * M:
        raise ValueError(f"x must have shape [B, 2M] with 2M = {2 * M}, got {list(x.shape)}")
    for name, p, shape in (("phase_direction", params.phase_direction, (2 * M + 1,)),
                           ("radial_direction", params.radial_direction, (2 * M + 1,)),
                           ("phase_amplitude", params.phase_amplitude, ()),
                           ("radial_amplitude", params.radial_amplitude, ()),
                           ("theta_log", params.theta_log, (M,))):
        if tuple(p.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(p.shape)}")
    if state is not None:
        for i, s in enumerate(state):
            if tuple(s.shape) != (x.shape[0], M):
                raise ValueError(f"state[{i}] must have shape [B, M] = {[x.shape[0], M]}, "
                                 f"got {list(s.shape)}")
    devices = {t.device for t in (x, *params, *(state or ()))}
    if len(devices) > 1:
        raise ValueError(f"x, params and state must be on one device, got {sorted(map(str, devices))}")


def launch(name: str, x: torch.Tensor, params: SAMUParams, state: Optional[State],
           cfg: DecodeConfig) -> tuple[torch.Tensor, State]:
    """Run the ``single`` or ``blocked`` kernel (no autograd)."""
    from ..kernels.decode import samu_decode_step

    B, M = x.shape[0], params.modes
    x = x.contiguous()
    p = [t.detach().contiguous() for t in params]
    out = empty(B, 2 * M, dtype=x.dtype, device=x.device)
    last_r = empty(B, M, dtype=torch.float32, device=x.device)
    last_i = empty(B, M, dtype=torch.float32, device=x.device)
    if state is None:
        state_r = state_i = last_r  # never read (HAS_STATE=False)
    else:
        state_r, state_i = (s.detach().to(torch.float32).contiguous() for s in state)
    tiles = triton.cdiv(M, cfg.block_m)
    per_program = tiles if name == "single" else 1
    grid = (triton.cdiv(tiles, per_program), B)
    samu_decode_step[grid](
        x, *p, state_r, state_i, out, last_r, last_i,
        M, per_program, 1.0 / math.sqrt(M),
        HAS_STATE=state is not None, BLOCK_D=cfg.block_d, BLOCK_M=cfg.block_m,
        num_warps=cfg.num_warps)
    return out, (last_r, last_i)


StrategyArg = Union[str, tuple[str, Union[DecodeConfig, dict, None]]]


def decode_step(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None, *,
                strategy: StrategyArg = "auto") -> tuple[torch.Tensor, State]:
    """One step of the SAMU layer: ``x [B, 2M]``, state (h_r, h_i) [B, M] or None (zeros).

    Returns ``(y [B, 2M] in x's dtype, new state fp32 [B, M])`` (float64 for the reference on
    float64 inputs).  ``strategy``: ``"auto"``, ``"single"``, ``"blocked"``, ``"reference"``,
    or ``(name, DecodeConfig | dict)``.  The kernels do not build an autograd graph: asking
    for one of them while gradients are needed raises ``ValueError``.
    """
    _check(x, params, state)
    name, config = (strategy, None) if isinstance(strategy, str) else strategy
    if name == "auto":
        name = choose(x, params, state)
    if name == "reference":
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return step_reference(x, params, state, dtype=dtype)
    if name not in ("single", "blocked"):
        raise ValueError(f"unknown decode strategy {name!r}; "
                         "expected 'auto', 'single', 'blocked' or 'reference'")
    if not kernels_available(x):
        raise ValueError(f"decode strategy {name!r} needs CUDA tensors or TRITON_INTERPRET=1")
    if _needs_grad(x, params, state):
        raise ValueError(f"decode strategy {name!r} has no backward; use 'reference' "
                         "(or torch.no_grad()) when gradients are needed")
    if config is None:
        cfg = default_config(name, params.modes)
    elif isinstance(config, DecodeConfig):
        cfg = config
    else:
        cfg = DecodeConfig(**config)
    return launch(name, x, params, state, cfg)
