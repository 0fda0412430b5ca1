"""Problems: what a strategy choice depends on, as frozen, hashable pydantic models.

One class per op, in the op's package (``samu_tune/ops/<op>/problem.py``).  Each carries its op's name in the class variable ``op`` and gives

- ``key()``: the stable cache key (the scan's keys are bare, e.g. ``B8-L4096-M512-bf16-train``;
  every other op's keys start with ``"<op>:"``, so entries of several ops share one cache file
  without clashing and an older samu_tune ignores the ones it cannot parse);
- ``feature_key()``: the key without its sizes (problems that may share a nearest choice);
- ``coords()``: the point in log-space that the nearest-key search measures distances in.

:func:`problem_from_key` inverts ``key()`` for any op.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import (BaseModel, PlainSerializer, PlainValidator, SerializationInfo,
                      ValidationError)

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


def _as_problem(value: Any) -> BaseModel:
    """A problem of a registered op, kept as it is; a dict parsed as the problem type its
    ``op`` entry names (written by the serializer), else (a dict without one, as written
    before ops were tagged) as the first op's problem type it fits, built-in ops in order."""
    types = problem_types()
    if isinstance(value, BaseModel):
        if isinstance(value, tuple(types.values())):
            return value
        raise ValueError(f"not a problem of a registered op: {type(value).__name__}")
    if isinstance(value, dict) and "op" in value:
        fields = {k: v for k, v in value.items() if k != "op"}
        if value["op"] not in types:
            raise ValueError(f"problem of unknown op {value['op']!r}; known: {sorted(types)}")
        return types[value["op"]].model_validate(fields)
    for cls in types.values():
        try:
            return cls.model_validate(value)
        except ValidationError:
            continue
    raise ValueError(f"not a problem of any op: {value!r}")


def _dump(problem: BaseModel, info: SerializationInfo) -> Any:
    """The problem's fields and its ``op`` (the type to parse it back as)."""
    return {"op": problem.op, **problem.model_dump(mode=info.mode)}


# any op's problem model (each op's ``problem.py``), in a pydantic field: kept as given,
# serialized with its fields and its op
Problem = Annotated[Any, PlainValidator(_as_problem), PlainSerializer(_dump)]


def problem_types() -> dict[str, type]:
    """op -> its problem class, for every registered op (built-in ops imported)."""
    from samu_tune import opspec
    return {op: opspec.get(op).problem_type for op in opspec.ops()}


def op_of_key(key: str) -> str:
    """The op a cache key belongs to: the prefix before ``:``, else ``scan``."""
    head, sep, _ = key.partition(":")
    return head if sep else "scan"


def problem_from_key(key: str, device: str = "cuda") -> Problem:
    """The problem of any op's ``key()``; ValueError for an unknown op or a malformed key."""
    op = op_of_key(key)
    types = problem_types()
    if op not in types:
        raise ValueError(f"key {key!r} of unknown op {op!r}; known: {sorted(types)}")
    return types[op].from_key(key, device=device)
