"""The generic linear scans' problem."""
from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from samu_tune.problem import _LONG_DTYPE, SHORT_DTYPE, DTypeName


class LinearProblem(BaseModel):
    """One generic linear scan (:func:`samu_tune.real_scan` / :func:`samu_tune.complex_scan`):
    h[t] = a[t] h[t-1] + b[t] over [B, L, D] (``complex``: pairs of real tensors), a in
    ``a_dtype``, b and the outputs in ``dtype``; ``reverse`` scans right to left; an initial
    state or not; forward or forward + backward.  Key e.g. ``linear:B4-L4096-D512-bf16-complex-
    train-rev-h0`` (``a<dtype>`` after the dtype when a's differs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    op: ClassVar[str] = "linear"

    B: int = Field(ge=1)
    L: int = Field(ge=1)
    D: int = Field(ge=1)
    dtype: DTypeName = "float32"
    a_dtype: DTypeName = "float32"
    complex: bool = False
    reverse: bool = False
    initial_state: bool = False
    backward: bool = True
    device: Literal["cuda", "cpu"] = "cuda"
    deterministic: bool = False

    @property
    def mode(self) -> str:
        return "train" if self.backward else "forward"

    def key(self) -> str:
        parts = [f"B{self.B}", f"L{self.L}", f"D{self.D}", SHORT_DTYPE[self.dtype]]
        if self.a_dtype != self.dtype:
            parts.append("a" + SHORT_DTYPE[self.a_dtype])
        parts += ["complex" if self.complex else "real", self.mode]
        for flag, label in ((self.reverse, "rev"), (self.initial_state, "h0"),
                            (self.deterministic, "det")):
            if flag:
                parts.append(label)
        return f"{self.op}:" + "-".join(parts)

    def feature_key(self) -> str:
        return f"{self.op}:" + self.key().split(":", 1)[1].split("-", 3)[3]

    def coords(self) -> tuple[float, float]:
        """(log(B*D), log(L)): the nearest-key search's space."""
        return math.log(self.B * self.D), math.log(self.L)

    @classmethod
    def from_key(cls, key: str, device: str = "cuda") -> "LinearProblem":
        """Inverse of :meth:`key`."""
        try:
            op, rest = key.split(":", 1)
            parts = rest.split("-")
            if op != cls.op:
                raise ValueError
            B, L, D = (int(p[1:]) for p in parts[:3])
            fields: dict[str, object] = dict(B=B, L=L, D=D, dtype=_LONG_DTYPE[parts[3]],
                                             device=device)
            fields["a_dtype"] = fields["dtype"]
            for part in parts[4:]:
                if part in ("complex", "real"):
                    fields["complex"] = part == "complex"
                elif part in ("train", "forward"):
                    fields["backward"] = part == "train"
                elif part.startswith("a") and part[1:] in _LONG_DTYPE:
                    fields["a_dtype"] = _LONG_DTYPE[part[1:]]
                else:
                    fields[{"rev": "reverse", "h0": "initial_state",
                            "det": "deterministic"}[part]] = True
            return cls(**fields)
        except (KeyError, ValueError, IndexError):
            raise ValueError(f"not a linear problem key: {key!r}") from None

    @property
    def elements(self) -> int:
        return self.B * self.L * self.D
