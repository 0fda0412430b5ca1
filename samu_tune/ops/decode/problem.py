"""The decode step's problem."""
from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from samu_tune.problem import _LONG_DTYPE, SHORT_DTYPE, DTypeName


class DecodeProblem(BaseModel):
    """One SAMU decode step (:func:`samu_tune.ops.decode.step.decode_step`): x [B, 2M] in
    ``dtype``, state (h_r, h_i) fp32 [B, M] given (``initial_state``) or zeros.  Forward only:
    the kernels have no backward (a step needing gradients runs the torch reference).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    op: ClassVar[str] = "decode"

    B: int = Field(ge=1)
    M: int = Field(ge=1)
    dtype: DTypeName = "bfloat16"
    device: Literal["cuda", "cpu"] = "cuda"
    initial_state: bool = True

    @property
    def mode(self) -> str:
        return "forward"

    @property
    def backward(self) -> bool:
        return False

    def key(self) -> str:
        """``decode:B4-M1024-bf16-h0`` (``h0`` when the state is given)."""
        parts = [f"B{self.B}", f"M{self.M}", SHORT_DTYPE[self.dtype]]
        if self.initial_state:
            parts.append("h0")
        return f"{self.op}:" + "-".join(parts)

    def feature_key(self) -> str:
        """``decode:bf16[-h0]``: the key without B and M."""
        rest = self.key().split(":", 1)[1]
        return f"{self.op}:" + rest.split("-", 2)[2]

    def coords(self) -> tuple[float, float]:
        """(log B, log M): the nearest-key search's space."""
        return math.log(self.B), math.log(self.M)

    @classmethod
    def from_key(cls, key: str, device: str = "cuda") -> "DecodeProblem":
        """Inverse of :meth:`key`."""
        try:
            op, rest = key.split(":", 1)
            parts = rest.split("-")
            if op != cls.op or parts[0][0] != "B" or parts[1][0] != "M" \
                    or any(p != "h0" for p in parts[3:]) or len(parts) > 4:
                raise ValueError
            return cls(B=int(parts[0][1:]), M=int(parts[1][1:]), dtype=_LONG_DTYPE[parts[2]],
                       device=device, initial_state="h0" in parts[3:])
        except (KeyError, ValueError, IndexError):
            raise ValueError(f"not a decode problem key: {key!r}") from None

    @property
    def elements(self) -> int:
        return self.B * self.M
