"""The shapes file of ``samu-tune profile``: a pydantic-validated YAML list of problems.

```yaml
shapes:                       # or the list at top level
  - {B: 8, L: [4096, 8192], M: 512, dtype: bfloat16, mode: both}
  - {B: 1, L: 16384, M: 256, resets: true, initial_state: true, final_state: true}
  - {op: decode, B: [1, 8, 64], M: 1024, dtype: bfloat16}     # SAMU.step, state given
  - {op: layer, B: 4, L: 4096, M: 512, mode: both}             # SAMU.forward (x [B, L, 2M])
  - {op: linear, B: 4, L: 4096, D: 512, complex: true}          # samu_tune.complex_scan
```
B, L, M (D) are a number or a list (the entry is their product); dtype is the writes' dtype,
control_dtype the controls'; mode is forward, train or both.  ``op: decode`` entries are decode
steps (:class:`samu_tune.ops.decode.problem.DecodeProblem`): no L, forward only (mode both means forward),
``initial_state`` (default true) says whether a state is passed; the scan-only fields
(control_dtype, resets, final_state) are refused.  ``op: layer`` entries are SAMU layer calls
(:class:`samu_tune.ops.layer.problem.LayerProblem`: unfused vs fused): as scan entries, without
control_dtype and final_state (fp32 controls, final state always).  ``op: linear`` entries are
generic linear scans (:class:`samu_tune.ops.linear.problem.LinearProblem`: ``real_scan`` /
``complex_scan``): D in place of M, ``a_dtype`` (default float32) the decays' dtype,
``complex``, ``reverse`` and ``initial_state`` (default false) as the problem's fields; the
SAMU-only fields (control_dtype, resets, final_state) are refused.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Literal, Optional, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from samu_tune.ops.decode.problem import DecodeProblem
from samu_tune.ops.layer.problem import LayerProblem
from samu_tune.ops.linear.problem import LinearProblem
from samu_tune.problem import Problem, dtype_name
from samu_tune.ops.scan.problem import ScanProblem

Sizes = Union[int, list[int]]
# the fields of one family of ops only: the linear scan's, the SAMU ops'
_LINEAR_ONLY = ("D", "a_dtype", "complex", "reverse")
_SAMU_ONLY = ("M", "control_dtype", "resets", "final_state")


class ShapesError(ValueError):
    """A shapes file that cannot be used; the message names the file, entry and field."""


class ShapeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: Literal["scan", "decode", "layer", "linear"] = "scan"
    B: Sizes
    L: Optional[Sizes] = None
    M: Optional[Sizes] = None
    D: Optional[Sizes] = None               # linear
    dtype: str = "bfloat16"
    control_dtype: str = "float32"
    a_dtype: str = "float32"                # linear
    complex: bool = False                   # linear
    reverse: bool = False                   # linear
    mode: Literal["forward", "train", "both"] = "both"
    resets: bool = False
    initial_state: Optional[bool] = None   # scan, layer, linear: False; decode: True
    final_state: bool = False

    @model_validator(mode="after")
    def _fields_of_the_op(self) -> "ShapeEntry":
        width = "D" if self.op == "linear" else "M"
        for field in (("L", width) if self.op != "decode" else (width,)):
            if getattr(self, field) is None:
                raise ValueError(f"a {self.op} shape needs {field}")
        given = self.model_fields_set
        alien = {"scan": _LINEAR_ONLY, "layer": _LINEAR_ONLY + ("control_dtype", "final_state"),
                 "decode": _LINEAR_ONLY + ("L", "control_dtype", "resets", "final_state"),
                 "linear": _SAMU_ONLY}[self.op]
        extra = [f for f in alien if f in given]
        if extra:
            raise ValueError(f"a {self.op} shape has no {', '.join(extra)}")
        if self.op == "decode" and self.mode == "train":
            raise ValueError("a decode shape is forward only (mode forward or both)")
        return self

    @field_validator("B", "L", "M", "D")
    @classmethod
    def _positive(cls, v: Optional[Sizes]) -> Optional[list[int]]:
        if v is None:
            return None
        values = v if isinstance(v, list) else [v]
        if not values:
            raise ValueError("must not be an empty list")
        for x in values:
            if x < 1:
                raise ValueError(f"must be >= 1, got {x}")
        return values

    @field_validator("dtype", "control_dtype", "a_dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        try:
            return dtype_name(v)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    def problems(self, device: str, mode: str | None = None) -> list[Problem]:
        """The entry's problems; ``mode`` (the CLI's --mode) overrides the entry's, and a
        decode entry yields nothing in train mode."""
        mode = mode or self.mode
        modes = ["forward", "train"] if mode == "both" else [mode]
        if self.op == "decode":
            if "forward" not in modes:
                return []
            state = True if self.initial_state is None else self.initial_state
            return [DecodeProblem(B=b, M=m, dtype=self.dtype, device=device,
                                  initial_state=state)
                    for b, m in itertools.product(self.B, self.M)]
        if self.op == "linear":
            return [LinearProblem(B=b, L=l, D=d, dtype=self.dtype, a_dtype=self.a_dtype,
                                  complex=self.complex, reverse=self.reverse,
                                  initial_state=bool(self.initial_state), device=device,
                                  backward=(md == "train"))
                    for md, b, l, d in itertools.product(modes, self.B, self.L, self.D)]
        if self.op == "layer":
            return [LayerProblem(B=b, L=l, M=m, dtype=self.dtype, device=device,
                                 backward=(md == "train"), resets=self.resets,
                                 initial_state=bool(self.initial_state))
                    for md, b, l, m in itertools.product(modes, self.B, self.L, self.M)]
        return [ScanProblem(B=b, L=l, M=m, dtype=self.dtype, control_dtype=self.control_dtype,
                            device=device, backward=(md == "train"), resets=self.resets,
                            initial_state=bool(self.initial_state),
                            final_state=self.final_state)
                for md, b, l, m in itertools.product(modes, self.B, self.L, self.M)]


class ShapesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shapes: list[ShapeEntry] = Field(min_length=1)


def load_shapes(path: str | Path) -> ShapesFile:
    """Read and validate ``path``; every problem raises :class:`ShapesError` with one line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ShapesError(f"{path}: no such file") from None
    except OSError as exc:
        raise ShapesError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ShapesError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if isinstance(raw, list):
        raw = {"shapes": raw}
    if not isinstance(raw, dict):
        raise ShapesError(f"{path}: expected a list of shapes or a mapping with 'shapes', "
                          f"got {type(raw).__name__}")
    try:
        return ShapesFile(**raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = list(err["loc"])
        if len(loc) >= 2 and loc[0] == "shapes" and isinstance(loc[1], int):
            field = ".".join(str(x) for x in loc[2:] if not isinstance(x, int)
                             and x not in ("int", "list[int]")) or "(entry)"
            raise ShapesError(f"{path}: entry {loc[1]}: field '{field}': {err['msg']}") from None
        raise ShapesError(f"{path}: {'.'.join(map(str, loc)) or '(top level)'}: {err['msg']}") from None
