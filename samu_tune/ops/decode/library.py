"""The decode step as the operators ``samu_tune::decode_step`` (functional) and
``decode_step_`` (writes its outputs in place); see :mod:`samu_tune.library`."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from samu_tune.library import F32 as _F32, strategy_arg


def _decode_plan(x: Tensor, M: int, has_state: bool, strategy: str):
    from samu_tune.ops.decode import step as decode
    return decode.plan_for(strategy_arg(strategy), x, M, has_state)


def _decode_run(x, consts, state_r, state_i, out, so_r, so_i, M, strategy):
    from samu_tune.ops.decode import step as decode
    has_state = state_r is not None
    plan = _decode_plan(x, M, has_state, strategy)
    if plan.name == "reference":
        raise ValueError("the decode operators run the single / blocked kernels; the "
                         "reference runs as traced torch code")
    state = (state_r, state_i) if has_state else None
    return decode._launch(plan, x, consts, state, out, (so_r, so_i) if so_r is not None
                          else None)


@torch.library.custom_op("samu_tune::decode_step", mutates_args=())
def decode_step(x: Tensor, consts: Tensor, state_r: Optional[Tensor],
                state_i: Optional[Tensor], M: int, strategy: str
                ) -> tuple[Tensor, Tensor, Tensor]:
    """One decode step: (y [B, 2M] in x's dtype, new state h_r, h_i fp32 [B, M]) from x
    [B, 2M], the digested parameters ``consts`` fp32 [8M + 4]
    (:func:`samu_tune.ops.decode.step.decode_constants`) and the state (None: zeros)."""
    y, (h_r, h_i) = _decode_run(x, consts, state_r, state_i, None, None, None, M, strategy)
    return y, h_r, h_i


@decode_step.register_fake
def _decode_step_fake(x, consts, state_r, state_i, M, strategy):
    B = x.shape[0]
    return (torch.empty_like(x), x.new_empty((B, M), dtype=_F32),
            x.new_empty((B, M), dtype=_F32))


@torch.library.custom_op("samu_tune::decode_step_",
                         mutates_args=("state_r", "state_i", "out"))
def decode_step_(x: Tensor, consts: Tensor, state_r: Tensor, state_i: Tensor, out: Tensor,
                 has_state: bool, M: int, strategy: str) -> None:
    """One decode step in place: reads the state from (state_r, state_i) when ``has_state``
    (else zeros) and writes the new state there and y into ``out``."""
    _decode_run(x, consts, state_r if has_state else None, state_i if has_state else None,
                out, state_r, state_i, M, strategy)


@decode_step_.register_fake
def _decode_step__fake(x, consts, state_r, state_i, out, has_state, M, strategy):
    return None


