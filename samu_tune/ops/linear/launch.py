"""Launch the generic linear-scan kernels (:mod:`samu_tune.kernels.linear`).

Complex tensors travel as :class:`Pair` (real, imag); real scans have ``imag = None``.
"""
from __future__ import annotations

from typing import Literal, NamedTuple, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune import intmath
from samu_tune.alloc import empty
from samu_tune.launch_options import LAUNCH_OPTIONS


class Pair(NamedTuple):
    r: torch.Tensor
    i: Optional[torch.Tensor] = None

    @property
    def is_complex(self) -> bool:
        return self.i is not None


class SerialConfig(BaseModel):
    """``serial``: one program per (D tile, row) walks L with the state in registers."""

    model_config = ConfigDict(frozen=True)

    block_d: Literal[16, 32, 64, 128, 256] = 64
    num_warps: Literal[1, 2, 4, 8] = 2


class ChunkConfig(BaseModel):
    """``chunk``: per-chunk summaries ([CHUNK, BLOCK_D] associative scans), a serial prefix
    over chunks, and a parallel replay."""

    model_config = ConfigDict(frozen=True)

    chunk: Literal[16, 32, 64, 128] = 32
    block_d: Literal[16, 32, 64, 128] = 32
    num_warps: Literal[1, 2, 4, 8] = 4


Config = Union[SerialConfig, ChunkConfig]


def _like(t: torch.Tensor, dtype: torch.dtype, complex_: bool, shape=None) -> Pair:
    shape = tuple(t.shape) if shape is None else shape
    make = lambda: empty(*shape, dtype=dtype, device=t.device)  # noqa: E731
    return Pair(make(), make() if complex_ else None)


def _ptrs(p: Optional[Pair], fallback: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel pointer arguments of a pair; absent parts point at ``fallback`` (never read)."""
    if p is None:
        return fallback, fallback
    return p.r, p.i if p.i is not None else p.r


def run(cfg: Config, *, reverse: bool, adjoint: bool, a: Pair, x: Pair, h0: Optional[Pair],
        out_dtype: torch.dtype, f: Optional[Pair] = None, f0: Optional[Pair] = None,
        grad_a_dtype: Optional[torch.dtype] = None
        ) -> tuple[Pair, Pair, Optional[Pair]]:
    """Run one scan; returns (out [B, L, D] in ``out_dtype``, last fp32 [B, D], grad_a or None).

    ``adjoint``: x is dout, h0 is d(final state), f/f0 are the forward outputs and initial
    state; grad_a comes back in ``grad_a_dtype`` and ``last`` is the forward h0's gradient.
    """
    from samu_tune.kernels import linear

    complex_ = a.is_complex
    B, L, D = a.r.shape
    out = _like(x.r, out_dtype, complex_)
    last = _like(x.r, torch.float32, complex_, (B, D))
    ga = _like(a.r, grad_a_dtype or a.r.dtype, complex_) if adjoint else None
    flags = dict(COMPLEX=complex_, REVERSE=reverse, ADJOINT=adjoint, **LAUNCH_OPTIONS)
    a_p, x_p, out_p, last_p = _ptrs(a, a.r), _ptrs(x, x.r), _ptrs(out, out.r), _ptrs(last, last.r)
    h0_p = _ptrs(h0, last.r)
    f_p, f0_p = _ptrs(f, out.r), _ptrs(f0, last.r)
    ga_p = _ptrs(ga, out.r)
    d_tiles = intmath.cdiv(D, cfg.block_d)
    if isinstance(cfg, SerialConfig):
        linear.linear_serial_scan[(d_tiles, B)](
            *a_p, *x_p, *h0_p, *out_p, *last_p, *f_p, *f0_p, *ga_p, L, D,
            HAS_H0=h0 is not None, HAS_F0=f0 is not None, BLOCK_D=cfg.block_d,
            num_warps=cfg.num_warps, **flags)
        return out, last, ga
    n_chunks = intmath.cdiv(L, cfg.chunk)
    p = _like(x.r, torch.float32, complex_, (B, n_chunks, D))
    q = _like(x.r, torch.float32, complex_, (B, n_chunks, D))
    carry = _like(x.r, torch.float32, complex_, (B, n_chunks, D))
    p_p, q_p, carry_p = _ptrs(p, p.r), _ptrs(q, q.r), _ptrs(carry, carry.r)
    grid = (d_tiles, B * n_chunks)
    launch = dict(CHUNK=cfg.chunk, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **flags)
    linear.linear_chunk_summary[grid](*a_p, *x_p, *p_p, *q_p, L, D, n_chunks, **launch)
    linear.linear_chunk_prefix[(d_tiles, B)](
        *p_p, *q_p, *h0_p, *carry_p, *last_p, *a_p, L, D, n_chunks,
        HAS_H0=h0 is not None, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **flags)
    linear.linear_chunk_replay[grid](
        *a_p, *x_p, *carry_p, *out_p, *f_p, *f0_p, *ga_p, L, D, n_chunks,
        HAS_F0=f0 is not None, **launch)
    return out, last, ga
