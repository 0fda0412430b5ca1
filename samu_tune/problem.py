"""Problems: what a strategy choice depends on, as frozen, hashable pydantic models.

One class per op (:class:`ScanProblem` for the scan, :class:`DecodeProblem` for the decode
step).  Each carries its op's name in the class variable ``op`` and gives

- ``key()``: the stable cache key (the scan's keys are bare, e.g. ``B8-L4096-M512-bf16-train``;
  every other op's keys start with ``"<op>:"``, so entries of several ops share one cache file
  without clashing and an older samu_tune ignores the ones it cannot parse);
- ``feature_key()``: the key without its sizes (problems that may share a nearest choice);
- ``coords()``: the point in log-space that the nearest-key search measures distances in.

:func:`problem_from_key` inverts ``key()`` for any op.
"""
from __future__ import annotations

import math
from typing import ClassVar, Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field

DTypeName = Literal["float64", "float32", "bfloat16", "float16"]

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "float64", torch.float32: "float32",
    torch.bfloat16: "bfloat16", torch.float16: "float16",
}
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}
SHORT_DTYPE: dict[str, str] = {"float64": "f64", "float32": "f32", "bfloat16": "bf16",
                               "float16": "f16"}
_LONG_DTYPE = {v: k for k, v in SHORT_DTYPE.items()}


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` / ``"bf16"`` / ``"bfloat16"`` -> ``"bfloat16"``."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES:
            raise TypeError(f"unsupported dtype {dtype}; expected one of {sorted(DTYPE_NAMES.values())}")
        return DTYPE_NAMES[dtype]
    name = str(dtype).removeprefix("torch.")
    name = _LONG_DTYPE.get(name, name)
    if name not in TORCH_DTYPES:
        raise TypeError(f"unsupported dtype {dtype!r}; expected one of {sorted(TORCH_DTYPES)}")
    return name


class ScanProblem(BaseModel):
    """The shape, dtypes and features of one scan call.

    ``backward`` is True when gradients will be taken (the "train" measurement mode), False
    for forward-only calls.  ``deterministic`` is set when torch's deterministic mode is on:
    strategies that use float atomics are then ineligible.
    """

    model_config = ConfigDict(frozen=True)
    op: ClassVar[str] = "scan"

    B: int = Field(ge=1)
    L: int = Field(ge=1)
    M: int = Field(ge=1)
    dtype: DTypeName = "bfloat16"
    control_dtype: DTypeName = "float32"
    device: Literal["cuda", "cpu"] = "cuda"
    backward: bool = True
    resets: bool = False
    initial_state: bool = False
    final_state: bool = False
    deterministic: bool = False

    @property
    def mode(self) -> str:
        return "train" if self.backward else "forward"

    def key(self) -> str:
        """Stable string key, e.g. ``B8-L4096-M512-bf16-train-resets``.

        The control dtype appears only when it is not float32; the device is not part of the
        key (the cache keeps one file per device signature).
        """
        parts = [f"B{self.B}", f"L{self.L}", f"M{self.M}", SHORT_DTYPE[self.dtype]]
        if self.control_dtype != "float32":
            parts.append(f"ctl{SHORT_DTYPE[self.control_dtype]}")
        parts.append(self.mode)
        for flag, label in ((self.resets, "resets"), (self.initial_state, "h0"),
                            (self.final_state, "final"), (self.deterministic, "det")):
            if flag:
                parts.append(label)
        return "-".join(parts)

    def feature_key(self) -> str:
        """The key without B, L and M: problems that may share a nearest-neighbour choice."""
        return self.key().split("-", 3)[3]

    def coords(self) -> tuple[float, float]:
        """(log(B*M), log(L)): the nearest-key search's space."""
        return math.log(self.B * self.M), math.log(self.L)

    @classmethod
    def from_key(cls, key: str, device: str = "cuda") -> "ScanProblem":
        """Inverse of :meth:`key`."""
        parts = key.split("-")
        try:
            B, L, M = (int(p[1:]) for p in parts[:3])
            fields: dict[str, object] = dict(B=B, L=L, M=M, dtype=_LONG_DTYPE[parts[3]],
                                             device=device)
            for part in parts[4:]:
                if part.startswith("ctl"):
                    fields["control_dtype"] = _LONG_DTYPE[part[3:]]
                elif part in ("train", "forward"):
                    fields["backward"] = part == "train"
                else:
                    fields[{"resets": "resets", "h0": "initial_state", "final": "final_state",
                            "det": "deterministic"}[part]] = True
        except (KeyError, ValueError, IndexError):
            raise ValueError(f"not a problem key: {key!r}") from None
        return cls(**fields)

    @property
    def elements(self) -> int:
        return self.B * self.L * self.M

    @classmethod
    def from_tensors(
        cls, eta: torch.Tensor, br: torch.Tensor, *, segment_pos: Optional[torch.Tensor] = None,
        initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        output_final_state: bool = False, backward: Optional[bool] = None,
        tensors: tuple[torch.Tensor, ...] = (),
    ) -> "ScanProblem":
        """Build the problem of a validated call.

        ``backward`` defaults to: grad mode is on and one of ``tensors`` requires grad.
        """
        if backward is None:
            backward = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in tensors)
        B, L, M = br.shape
        return cls(
            B=B, L=L, M=M, dtype=dtype_name(br.dtype), control_dtype=dtype_name(eta.dtype),
            device="cuda" if br.device.type == "cuda" else "cpu", backward=bool(backward),
            resets=segment_pos is not None, initial_state=initial_state is not None,
            final_state=bool(output_final_state),
            deterministic=torch.are_deterministic_algorithms_enabled(),
        )


class DecodeProblem(BaseModel):
    """One SAMU decode step (:func:`samu_tune.layer.decode.decode_step`): x [B, 2M] in
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


class LayerProblem(ScanProblem):
    """One SAMU layer call (:class:`samu_tune.SAMU`): x [B, L, 2M] in ``dtype`` -> y [B, L, 2M]
    and the final state, forward or forward + backward (``backward``), with resets
    (``segment_pos``) and an initial state or not.  The fields are the scan's (the layer's
    scan is that problem with ``final_state``; the controls are fp32), the key is the scan key
    prefixed ``layer:``, e.g. ``layer:B8-L4096-M512-bf16-train``."""

    op: ClassVar[str] = "layer"

    def key(self) -> str:
        return f"{self.op}:" + super().key()

    def feature_key(self) -> str:
        return f"{self.op}:" + super().key().split("-", 3)[3]

    @classmethod
    def from_key(cls, key: str, device: str = "cuda") -> "LayerProblem":
        """Inverse of :meth:`key`."""
        op, sep, rest = key.partition(":")
        if op != cls.op or not sep:
            raise ValueError(f"not a layer problem key: {key!r}")
        return super().from_key(rest, device)


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


Problem = Union[ScanProblem, DecodeProblem, LayerProblem, LinearProblem]
PROBLEM_TYPES: dict[str, type] = {"scan": ScanProblem, "decode": DecodeProblem,
                                  "layer": LayerProblem, "linear": LinearProblem}


def op_of_key(key: str) -> str:
    """The op a cache key belongs to: the prefix before ``:``, else ``scan``."""
    head, sep, _ = key.partition(":")
    return head if sep else "scan"


def problem_from_key(key: str, device: str = "cuda") -> Problem:
    """The problem of any op's ``key()``; ValueError for an unknown op or a malformed key."""
    op = op_of_key(key)
    if op not in PROBLEM_TYPES:
        raise ValueError(f"key {key!r} of unknown op {op!r}; known: {sorted(PROBLEM_TYPES)}")
    return PROBLEM_TYPES[op].from_key(key, device=device)
