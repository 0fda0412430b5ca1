"""The generic linear scans as a tuned op: strategies ``serial``, ``chunk``, ``reference`` of
:func:`samu_tune.real_scan` / :func:`samu_tune.complex_scan` and their
:class:`samu_tune.opspec.OpSpec`.

A :class:`~samu_tune.ops.linear.problem.LinearProblem` (B, L, D, dtypes, real or complex, reverse, initial
state, forward or train) is tuned like a scan problem, stored under ``linear:<key>``, and
``strategy="auto"`` resolves through the cache, the shipped table, then the rule (the torch
reference for float64, ``chunk`` for long sequences with few (row, D tile) programs, else
``serial``).  A strategy runs on :class:`LinearInputs` and returns ``(out, last)`` as
:class:`~samu_tune.ops.linear.launch.Pair` s: outputs [B, L, D] in b's dtype, final state fp32 [B, D].
Verification: forward and (train) the gradients of a, b and h0 against the float64 torch loop
(:func:`~samu_tune.ops.linear.reference.linear_scan_reference`) at ``TOLERANCES[dtype]``.
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune import intmath, timing
from samu_tune.device import DeviceInfo
from samu_tune.opspec import OpSpec, register_op
from samu_tune.problem import TORCH_DTYPES
from samu_tune.ops.linear.problem import LinearProblem
from samu_tune.registry import Strategy, device_reasons, register
from samu_tune.tolerances import check_all
from samu_tune.ops.linear import scan as linear_scan
from samu_tune.ops.linear.launch import ChunkConfig, Pair, SerialConfig
from samu_tune.ops.linear.reference import linear_scan_reference
from samu_tune.ops.linear import library  # noqa: F401  (registers the samu_tune::* operators)


class LinearInputs(NamedTuple):
    """a, b: [B, L, D] pairs (imag None for a real scan); h0: [B, D] pair or None."""

    a: Pair
    b: Pair
    h0: Optional[Pair]
    reverse: bool

    def leaves(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for p in (self.a, self.b, self.h0) if p is not None
                     for t in p if t is not None)


LinearOutput = tuple[Pair, Pair]


class LinearCapability(BaseModel):
    """What a linear-scan strategy can run; :meth:`reasons` says why not."""

    model_config = ConfigDict(frozen=True)

    dtypes: frozenset[str] = frozenset({"float32", "bfloat16", "float16"})
    devices: frozenset[str] = frozenset({"cuda"})
    triton: bool = True
    deterministic: bool = True

    def reasons(self, problem: LinearProblem, device: Optional[DeviceInfo] = None) -> list[str]:
        out = []
        for what, dt in (("dtype", problem.dtype), ("a dtype", problem.a_dtype)):
            if dt not in self.dtypes:
                out.append(f"{what} {dt} not in {sorted(self.dtypes)}")
        return out + device_reasons(problem.device, self.devices, self.triton, device)


# ---- strategies ------------------------------------------------------------------------------

def valid(problem: LinearProblem, cfg: BaseModel) -> bool:
    """Tiles no larger than needed (the smallest choice always stays)."""
    if cfg.block_d > max(16, intmath.next_power_of_2(problem.D)):
        return False
    return not (isinstance(cfg, ChunkConfig)
                and cfg.chunk > max(16, intmath.next_power_of_2(problem.L)))


def _kernel_run(name: str):
    def run(inputs: LinearInputs, cfg: BaseModel) -> LinearOutput:
        B, L, D = inputs.a.r.shape
        return linear_scan._scan(inputs.a, inputs.b, inputs.h0, inputs.reverse, (name, cfg),
                                 B, L, D)
    return run


def _reference_run(inputs: LinearInputs, cfg=None) -> LinearOutput:
    return linear_scan_reference(inputs.a, inputs.b, inputs.h0, reverse=inputs.reverse)


_MODULES = (sys.modules[__name__], linear_scan)
for _name, _model, _priority, _what in (
        ("serial", SerialConfig, 10, "one program per (D tile, row) walks L"),
        ("chunk", ChunkConfig, 5, "chunk summaries, a serial prefix over chunks, replay")):
    register(Strategy(
        name=_name, description=_what, capability=LinearCapability(),
        run=_kernel_run(_name), config_model=_model, valid=valid,
        default=lambda p, n=_name: linear_scan.default_config(n, p.B, p.L, p.D),
        priority=_priority, modules=_MODULES, op="linear"))

register(Strategy(
    name="reference", description="torch loop; any device, float64-capable",
    capability=LinearCapability(dtypes=frozenset({"float64", "float32", "bfloat16", "float16"}),
                                devices=frozenset({"cpu", "cuda"}), triton=False),
    run=_reference_run, priority=-100, modules=(sys.modules[__name__],), op="linear"))


def length_rule(problem: LinearProblem, eligible: list[Strategy]) -> Optional[tuple[str, str]]:
    """The untuned choice: ``chunk`` for L >= 256 with fewer than 256 (row, 64-wide D tile)
    programs, else ``serial`` (float64 and CPU without the interpreter: the reference, by
    eligibility)."""
    names = {s.name for s in eligible}
    if "serial" not in names:
        return None
    if problem.L >= 256 and problem.B * intmath.cdiv(problem.D, 64) < 256 and "chunk" in names:
        return "chunk", "long L with few (row, D tile) programs (rule)"
    return "serial", "enough (row, D tile) programs or short L (rule)"


# ---- the op spec -----------------------------------------------------------------------------

def random_inputs(problem: LinearProblem, *, seed: int = 0,
                  device: Optional[str] = None) -> LinearInputs:
    """|a| uniform in [0.6, 0.95] with a random phase (neither exploding nor forgetting at
    once), b ~ N(0,1), h0 ~ N(0,1) fp32; drawn in float64 on the CPU from ``seed``."""
    device = device or problem.device
    B, L, D = problem.B, problem.L, problem.D
    g = torch.Generator().manual_seed(seed)
    mag = 0.6 + 0.35 * torch.rand(B, L, D, generator=g, dtype=torch.float64)
    ang = torch.randn(B, L, D, generator=g, dtype=torch.float64)
    a_dt, b_dt = TORCH_DTYPES[problem.a_dtype], TORCH_DTYPES[problem.dtype]

    def cast(t, dt):
        return t.to(dt).to(device)

    if problem.complex:
        a = Pair(cast(mag * torch.cos(ang), a_dt), cast(mag * torch.sin(ang), a_dt))
        b = Pair(*(cast(torch.randn(B, L, D, generator=g, dtype=torch.float64), b_dt)
                   for _ in range(2)))
    else:
        a = Pair(cast(mag * torch.sign(ang), a_dt))
        b = Pair(cast(torch.randn(B, L, D, generator=g, dtype=torch.float64), b_dt))
    h0 = None
    if problem.initial_state:
        spec = torch.float64 if problem.dtype == "float64" else torch.float32
        parts = [cast(torch.randn(B, D, generator=g, dtype=torch.float64), spec)
                 for _ in range(2 if problem.complex else 1)]
        h0 = Pair(*parts)
    return LinearInputs(a, b, h0, problem.reverse)


def _leaf_inputs(inputs: LinearInputs, dtype: Optional[torch.dtype] = None) -> LinearInputs:
    def leaf(t):
        if t is None:
            return None
        t = t.detach().clone() if dtype is None else t.detach().to(dtype)
        return t.requires_grad_(True)

    def pair(p):
        return None if p is None else Pair(leaf(p.r), leaf(p.i))
    return LinearInputs(pair(inputs.a), pair(inputs.b), pair(inputs.h0), inputs.reverse)


def _upstream(inputs: LinearInputs, seed: int) -> tuple[torch.Tensor, ...]:
    B, L, D = inputs.a.r.shape
    g = torch.Generator().manual_seed(seed + 1)
    n = 2 if inputs.a.is_complex else 1
    dev = inputs.a.r.device
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64).to(dev)
                 for shape in [(B, L, D)] * n + [(B, D)] * n)


def _outputs(out: Pair, last: Pair) -> list[tuple[str, torch.Tensor]]:
    items = [("out_r", out.r), ("last_r", last.r)]
    if out.i is not None:
        items += [("out_i", out.i), ("last_i", last.i)]
    return items


def _forward_backward(run, inputs: LinearInputs, backward: bool, upstream) -> dict:
    out, last = run(inputs)
    result = dict(_outputs(out, last))
    if backward:
        n = 2 if inputs.a.is_complex else 1
        outs = [out.r, out.i][:n] + [last.r, last.i][:n]
        loss = sum((o.double() * u).sum() for o, u in zip(outs, upstream))
        names = ["a_r", "a_i"][:n] + ["b_r", "b_i"][:n] + (
            ["h0_r", "h0_i"][:n] if inputs.h0 is not None else [])
        grads = torch.autograd.grad(loss, inputs.leaves(), allow_unused=True)
        result.update({"grad_" + k: g for k, g in zip(names, grads)})
    return result


def expected(inputs: LinearInputs, problem: LinearProblem, *, seed: int = 0) -> dict:
    """The float64 torch loop's outputs, final state and (train) gradients of a, b, h0."""
    return _forward_backward(_reference_run, _leaf_inputs(inputs, torch.float64),
                             problem.backward, _upstream(inputs, seed))


def verify(run, inputs: LinearInputs, problem: LinearProblem, *, seed: int = 0,
           reference: Optional[dict] = None) -> Optional[str]:
    """None when ``run(inputs)`` matches the float64 reference within ``TOLERANCES[dtype]``."""
    if reference is None:
        reference = expected(inputs, problem, seed=seed)
    got = _forward_backward(run, _leaf_inputs(inputs), problem.backward,
                            _upstream(inputs, seed))
    return check_all(got, reference, problem.dtype, state_prefix="last")


def verification_problem(problem: LinearProblem, strategy: Strategy, config: BaseModel,
                         device: Optional[DeviceInfo] = None) -> LinearProblem:
    """B <= 2, L <= 80 (else 64 + L % 16), D <= 48 (else 32 + D % 16); the real problem when
    the config is not valid at the small one (kernels take B, L, D at runtime)."""
    L = problem.L if problem.L <= 80 else 64 + problem.L % 16
    D = problem.D if problem.D <= 48 else 32 + problem.D % 16
    small = problem.model_copy(update=dict(B=min(problem.B, 2), L=L, D=D))
    if not strategy.reasons(small, device) and (
            strategy.valid is None or strategy.valid(small, config)):
        return small
    return problem


class LinearStep(timing.AutogradStep):
    """The linear op's timed call: forward, or forward + backward of a, b and h0."""

    inputs = staticmethod(random_inputs)
    leaves = staticmethod(_leaf_inputs)
    upstream = staticmethod(_upstream)

    @staticmethod
    def outputs(result: LinearOutput) -> list[torch.Tensor]:
        out, last = result
        n = 2 if out.i is not None else 1
        return [out.r, out.i][:n] + [last.r, last.i][:n]


def input_bytes(problem: LinearProblem) -> int:
    """a, b and the outputs [B, L, D] (pairs when complex; doubled for the gradients)."""
    n = 2 if problem.complex else 1
    a_item = TORCH_DTYPES[problem.a_dtype].itemsize
    b_item = TORCH_DTYPES[problem.dtype].itemsize
    per = n * problem.B * problem.L * problem.D * (a_item + 2 * b_item)
    return per * (2 if problem.backward else 1)


def finite(result: LinearOutput) -> bool:
    out, last = result
    return all(bool(torch.isfinite(t).all()) for p in (out, last) for t in p if t is not None)


SPEC = register_op(OpSpec(
    op="linear", problem_type=LinearProblem, random_inputs=random_inputs, expected=expected,
    verify=verify, verification_problem=verification_problem, make_step=LinearStep,
    input_bytes=input_bytes, finite=finite, rules=[length_rule], relax=None))

__all__ = ["LinearInputs", "LinearCapability", "SPEC", "valid", "length_rule"]
