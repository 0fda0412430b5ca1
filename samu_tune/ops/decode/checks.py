"""Input and output-buffer checks of the decode step (:class:`samu_tune.ops.decode.step.Decoder`).

Every error names the argument and the expected shape, dtype or device.  The output checks
(``out``, ``state_out``: shapes, dtypes, aliasing) cost ~5 us of host time per step on the
development CPU, a third of a step's; :class:`OutputsChecked` keeps the generation loop's
buffers once checked and then compares only the new x with them.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from samu_tune.ops.layer.reference import State


def check_buffer(what: str, t: torch.Tensor, shape: tuple, dtype: torch.dtype,
                 device: torch.device) -> int:
    """Raise unless t is a contiguous ``dtype`` tensor of ``shape`` on ``device``; its address."""
    if (not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != dtype
            or t.device != device or not t.is_contiguous()):
        got = (f"{list(t.shape)} {t.dtype} on {t.device}, contiguous={t.is_contiguous()}"
               if isinstance(t, torch.Tensor) else type(t).__name__)
        raise ValueError(f"{what} must be a contiguous {dtype} tensor of shape {list(shape)} "
                         f"on {device}, got {got}")
    return t.data_ptr()


def check_outputs(x: torch.Tensor, state: Optional[State], out: Optional[torch.Tensor],
                   state_out: Optional[State], M: int) -> None:
    """Shapes, dtypes, and aliasing: out overlaps nothing; state_out[i] is state[i] or new.

    Compares the byte ranges [start, end) of contiguous extents; a non-contiguous x or state
    is copied before the launch, so only contiguous inputs can alias an output.  An entry is
    (start, end, tag): equal tags mark state[i] and state_out[i], the one allowed alias.
    """
    B = x.shape[0]
    p = x.data_ptr()
    inputs = [(p, p + x.numel() * x.element_size(), "x")]
    if state is not None:
        for i, s in enumerate(state):
            p = s.data_ptr()
            inputs.append((p, p + s.numel() * s.element_size(), i))
    outputs = []
    if state_out is not None:
        if not isinstance(state_out, (tuple, list)) or len(state_out) != 2:
            raise ValueError("state_out must be a pair (h_r, h_i) of fp32 [B, M] tensors")
        for i, s in enumerate(state_out):
            p = check_buffer(f"state_out[{i}]", s, (B, M), torch.float32, x.device)
            outputs.append((p, p + B * M * 4, i))
    if out is not None:
        p = check_buffer("out", out, (B, 2 * M), x.dtype, x.device)
        outputs.append((p, p + out.numel() * out.element_size(), "out"))
    for k, (o0, o1, otag) in enumerate(outputs):
        for p0, p1, ptag in inputs + outputs[k + 1:]:
            if o0 < p1 and p0 < o1 and not (otag == ptag and o0 == p0 and o1 == p1):
                def name(tag, prefix):
                    return tag if isinstance(tag, str) else f"{prefix}[{tag}]"
                other = name(ptag, "state" if (p0, p1, ptag) in inputs else "state_out")
                raise ValueError(f"{name(otag, 'state_out')} overlaps {other}: an output may "
                                 "only be its own state (state_out[i] = state[i], in place)")


def check_inputs(x: torch.Tensor, M: int, state: Optional[State]) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2 or x.shape[1] != 2 * M:
        raise ValueError(f"x must have shape [B, 2M] with 2M = {2 * M}, got {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")
    if state is not None:
        if len(state) != 2:
            raise ValueError("state must be a pair (h_r, h_i) of [B, M] tensors")
        shape, device = (x.shape[0], M), x.device
        for i, s in enumerate(state):
            if s.shape != shape:
                raise ValueError(f"state[{i}] must have shape [B, M] = {list(shape)}, "
                                 f"got {list(s.shape)}")
            if s.device != device:
                raise ValueError(f"x and state must be on one device, got {x.device} and "
                                 f"{s.device}")


class _Checked(NamedTuple):
    """The in-place loop's buffers as last checked, and where their bytes lie."""

    out: torch.Tensor
    h_r: torch.Tensor
    h_i: torch.Tensor
    x_shape: torch.Size
    device: torch.device
    out_shape: torch.Size
    spans: tuple[tuple[int, int], ...]      # [start, end) of out, h_r, h_i


def _span(t: torch.Tensor) -> tuple[int, int]:
    p = t.data_ptr()
    return p, p + t.numel() * t.element_size()


class OutputsChecked:
    """:func:`check_outputs`, remembered for the in-place generation loop: the same ``out`` and
    ``state_out`` tensors as the last checked call, ``state_out`` being ``state`` itself, at
    the same addresses, shape, dtype and device.  Then only the new x is compared with them
    (x is a new tensor each step); anything else runs the full check.  It holds the three
    buffers (small: [B, 2M] and 2 x [B, M]) until another call's check replaces them."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: Optional[_Checked] = None

    def check(self, x: torch.Tensor, state: Optional[State], out: Optional[torch.Tensor],
              state_out: Optional[State], M: int) -> None:
        last = self._last
        if (last is not None and state is not None and state_out is not None
                and out is last.out and state[0] is last.h_r and state[1] is last.h_i
                and len(state_out) == 2 and state_out[0] is last.h_r
                and state_out[1] is last.h_i and x.shape == last.x_shape
                and x.dtype == out.dtype and x.device == last.device
                and out.shape == last.out_shape):
            (o0, o1), (r0, r1), (i0, i1) = last.spans
            if (out.data_ptr() == o0 and last.h_r.data_ptr() == r0
                    and last.h_i.data_ptr() == i0):
                x0, x1 = _span(x)
                if not (x0 < o1 and o0 < x1) and not (x0 < r1 and r0 < x1) \
                        and not (x0 < i1 and i0 < x1):
                    return
        self._last = None
        check_outputs(x, state, out, state_out, M)
        if (state is not None and state_out is not None and out is not None
                and state_out[0] is state[0] and state_out[1] is state[1]):
            self._last = _Checked(out, state[0], state[1], x.shape, x.device, out.shape,
                                  (_span(out), _span(state[0]), _span(state[1])))
