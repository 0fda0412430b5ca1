"""The scan's :class:`samu_tune.opspec.OpSpec`: the tuner's hooks bound to the scan's
random inputs (:mod:`samu_tune.ops.scan.verify`), timed call
(:class:`samu_tune.ops.scan.timing.Step`),
verification problem and dispatch fallbacks."""
from __future__ import annotations

from typing import Optional

import torch
from pydantic import BaseModel

from samu_tune.ops.scan import timing as scan_timing
from samu_tune.ops.scan import verify
from samu_tune.device import DeviceInfo
from samu_tune.opspec import OpSpec, register_op
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.registry import Strategy
from samu_tune.rules import RULES
from samu_tune.ops.scan.tensors import ScanOutput
from samu_tune.ops.scan import strategies  # noqa: F401  (registers the scan's strategies)
from samu_tune.ops.scan import library  # noqa: F401  (registers the samu_tune::* operators)


def _small_sizes(n: int, keep: int, base: int, mod: int) -> int:
    return n if n <= keep else base + n % mod


def verification_problem(problem: ScanProblem, strategy: Strategy, config: BaseModel,
                         device: Optional[DeviceInfo] = None) -> ScanProblem:
    """The problem a candidate is verified on (see :mod:`samu_tune.tuner` for the choice):
    B <= 2, L kept when <= 320 else 256 + L % 64, M kept when <= 64 else 64 (M % 32 == 0) or
    32 + M % 32.  When the candidate's config is not valid for (or its strategy not eligible
    at) that shape: the real M, then L doubled (512 + L % 64, 1024 + L % 64, ... below the
    real L; a config that needs many chunks, e.g. a grouped prefix of 16 chunk maps, is valid
    there), each with the small then the real M, then the real L, then the real shape.  The
    float64 reference is a loop over L: at the real L of a long problem it takes a minute."""
    B = min(problem.B, 2)
    L = _small_sizes(problem.L, 320, 256, 64)
    if problem.M <= 64:
        M = problem.M
    else:
        M = 64 if problem.M % 32 == 0 else 32 + problem.M % 32
    lengths = [L]
    base, tail = 256, problem.L % 64
    while problem.L > 320 and 2 * base + tail < problem.L:
        base *= 2
        lengths.append(base + tail)
    shapes = [(B, l, m) for l in lengths for m in dict.fromkeys((M, problem.M))]
    for b, l, m in (*shapes, (B, problem.L, problem.M)):
        small = problem.model_copy(update=dict(B=b, L=l, M=m))
        if not strategy.reasons(small, device) and (
                strategy.valid is None or strategy.valid(small, config)):
            return small
    return problem


def finite(out: ScanOutput) -> bool:
    tensors = [out.real, out.imag] + list(out.final_state or ())
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def without_state_features(problem: ScanProblem) -> Optional[tuple[ScanProblem, str]]:
    """The same problem without initial / final state: those add one [B, M] read or write to
    a [B, L, M] scan, so a winner tuned without them is the best guess with them (the SAMU
    layer always asks for the final state; the shipped tables hold plain scans).  Resets,
    mode, dtypes and determinism are never relaxed."""
    if not (problem.initial_state or problem.final_state):
        return None
    plain = problem.model_copy(update={"initial_state": False, "final_state": False})
    return plain, "without initial/final state"


SPEC = register_op(OpSpec(
    op="scan", problem_type=ScanProblem,
    random_inputs=verify.random_inputs, expected=verify.expected, verify=verify.verify,
    verification_problem=verification_problem, make_step=scan_timing.Step,
    input_bytes=scan_timing.input_bytes, finite=finite, rules=RULES,
    relax=without_state_features))
