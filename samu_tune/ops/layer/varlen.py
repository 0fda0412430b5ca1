"""Scan conveniences: packed variable-length batches (``cu_seqlens``) and right-to-left scans.

``scan(..., cu_seqlens=..., reverse=...)`` has :func:`samu_tune.scan`'s signature plus:

- ``cu_seqlens``: int [N+1] with ``cu_seqlens[0] = 0``, non-decreasing, ``cu_seqlens[-1] = L``:
  N sequences packed into one row (B = 1), sequence n at ``[cu[n], cu[n+1])``.  It is
  turned into ``segment_pos`` (:func:`cu_seqlens_to_segment_pos`); each sequence starts from
  a zero state, so ``initial_state`` is refused.  The final state is per sequence, [N, M]:
  the output at each sequence's last token (first token when ``reverse``), cast to fp32 --
  exact for float32 writes, rounded to br's dtype otherwise; zero for an empty sequence.
- ``reverse=True``: ``h[t] = A[t] h[t+1] + b[t]`` from t = L-1 down to 0, ``h[L] = h0``; the
  final state is h[0].  Implemented by flipping the inputs along L and scanning left to
  right.  With resets, the right-to-left sequence restarts at every token whose right
  neighbour starts a segment (segment_pos == 0), i.e. at the last token of each segment
  (:func:`reverse_segment_pos`).  h0 always enters at t = L-1: the rightmost segment
  continues from it, as the leftmost one does in a forward scan whose row has no reset at
  t = 0.
"""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune import dispatch
from samu_tune.ops.scan.api import scan as _scan
from samu_tune.ops.scan.tensors import ScanOutput


def _positions(starts: torch.Tensor) -> torch.Tensor:
    """int32 positions counting up from 0 at each True of ``starts`` [..., L] (from 1 before
    the first start, so only starts are 0)."""
    L = starts.shape[-1]
    t = torch.arange(L, device=starts.device).expand_as(starts)
    last_start = torch.where(starts, t, torch.full_like(t, -1)).cummax(dim=-1).values
    return (t - last_start).to(torch.int32)


def cu_seqlens_to_segment_pos(cu_seqlens: torch.Tensor, L: int) -> torch.Tensor:
    """``segment_pos`` [1, L] int32 of N sequences packed into one row of length L.

    ``cu_seqlens``: integer [N+1], ``cu_seqlens[0] = 0``, non-decreasing, ``cu_seqlens[-1] =
    L``.  Position t of sequence n gets ``t - cu_seqlens[n]`` (0 where a sequence starts, so
    the scan resets there).  Validation reads cu_seqlens on the host (one sync on CUDA).
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must have shape [N+1] with N >= 1, got "
                         f"{list(cu_seqlens.shape)}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must have an integer dtype, got {cu_seqlens.dtype}")
    host = cu_seqlens.detach().cpu()
    if int(host[0]) != 0 or int(host[-1]) != L:
        raise ValueError(f"cu_seqlens must start at 0 and end at L = {L}, got "
                         f"{int(host[0])} .. {int(host[-1])}")
    if bool((host[1:] < host[:-1]).any()):
        raise ValueError("cu_seqlens must be non-decreasing")
    starts = torch.zeros(L, dtype=torch.bool, device=cu_seqlens.device)
    begin = cu_seqlens[:-1].long()
    starts[begin[begin < L]] = True
    return _positions(starts)[None]


def reverse_segment_pos(segment_pos: torch.Tensor) -> torch.Tensor:
    """The ``segment_pos`` of the inputs flipped along L for a right-to-left scan, [B, L].

    Token t starts a right-to-left sequence when t + 1 starts a left-to-right one; the result
    is in flipped order (index s is token L-1-s), ready for the flipped scan.
    """
    nxt = segment_pos[:, 1:] == 0
    starts = torch.cat([nxt, torch.zeros_like(nxt[:, :1])], dim=1)      # [B, L], original order
    return _positions(starts.flip(1))


def _flip(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.flip(1)


def scan(eta: torch.Tensor, delta: torch.Tensor, nu_log: torch.Tensor, theta_log: torch.Tensor,
         br: torch.Tensor, bi: torch.Tensor, *,
         initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
         segment_pos: Optional[torch.Tensor] = None,
         cu_seqlens: Optional[torch.Tensor] = None,
         output_final_state: bool = False, reverse: bool = False,
         strategy: dispatch.StrategyArg = "auto") -> ScanOutput:
    """:func:`samu_tune.scan` with ``cu_seqlens`` and ``reverse`` (see the module docstring).

    Returns ``ScanOutput(real, imag, final_state)``; with ``cu_seqlens`` the final state is
    (h_r, h_i) [N, M] per sequence.
    """
    if cu_seqlens is not None:
        if segment_pos is not None:
            raise ValueError("give segment_pos or cu_seqlens, not both")
        if initial_state is not None:
            raise ValueError("initial_state with cu_seqlens is not supported: each packed "
                             "sequence starts from a zero state")
        if br.ndim != 3 or br.shape[0] != 1:
            raise ValueError(f"cu_seqlens needs packed inputs with B = 1, got br of shape "
                             f"{list(br.shape)}")
        segment_pos = cu_seqlens_to_segment_pos(cu_seqlens, br.shape[1])
    if reverse:
        if segment_pos is not None:
            if not isinstance(segment_pos, torch.Tensor) or segment_pos.ndim != 2:
                raise ValueError("segment_pos must be a [B, L] integer tensor")
            segment_pos = reverse_segment_pos(segment_pos)
        eta, delta, br, bi = (_flip(t) for t in (eta, delta, br, bi))
    out = _scan(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                        segment_pos=segment_pos,
                        output_final_state=output_final_state and cu_seqlens is None,
                        strategy=strategy)
    real, imag = (out.real.flip(1), out.imag.flip(1)) if reverse else (out.real, out.imag)
    final = out.final_state
    if output_final_state and cu_seqlens is not None:
        final = _sequence_states(real, imag, cu_seqlens, reverse)
    return ScanOutput(real, imag, final)


def _sequence_states(real: torch.Tensor, imag: torch.Tensor, cu_seqlens: torch.Tensor,
                     reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_r, h_i) [N, M] fp32: each sequence's state after its last scanned token."""
    cu = cu_seqlens.long()
    if not real.shape[1]:                # no token at all: every sequence's state is zero
        zero = real.new_zeros(cu.numel() - 1, real.shape[2], dtype=torch.float32)
        return zero, zero.clone()
    nonempty = (cu[1:] > cu[:-1])[:, None]                               # [N, 1]
    index = (cu[:-1] if reverse else cu[1:] - 1).clamp(0, real.shape[1] - 1)
    pick = lambda t: torch.where(nonempty, t[0, index].float(), 0.0)     # noqa: E731
    return pick(real), pick(imag)
