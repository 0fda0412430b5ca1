"""The decode step as a tuned op: its strategies (``single``, ``blocked``, ``reference``) and
its :class:`samu_tune.opspec.OpSpec`.

A :class:`~samu_tune.ops.decode.problem.DecodeProblem` (B, M, dtype, device, state given) is tuned like a
scan problem (``samu_tune.tune(DecodeProblem(...))``), its winner stored in the same cache file
under ``decode:<key>``, and ``decode_step(..., strategy="auto")`` resolves through the cache
(:func:`samu_tune.ops.decode.step.decision`).

A strategy runs on :class:`DecodeInputs` and returns ``(y [B, 2M] in x's dtype, (h_r, h_i) fp32
[B, M])``; the parameters arrive digested (``consts``, as :class:`~samu_tune.ops.decode.step.Decoder`
keeps them), so a timed call is what a cached ``SAMU.step`` does: one launch.  Verification
compares y and the new state with :func:`samu_tune.ops.layer.reference.step_reference` in float64
at ``TOLERANCES[dtype].forward`` (as tests/test_decode.py does).
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune import intmath, timing
from samu_tune.device import DeviceInfo
from samu_tune.kernels import decode as kernels
from samu_tune.opspec import OpSpec, register_op
from samu_tune.problem import TORCH_DTYPES
from samu_tune.ops.decode.problem import DecodeProblem
from samu_tune.registry import Strategy, device_reasons, register
from samu_tune.tolerances import TOLERANCES, check
from samu_tune.ops.decode import step as decode
from samu_tune.ops.layer.reference import SAMUParams, State, step_reference
from samu_tune.ops.decode import library  # noqa: F401  (registers the samu_tune::* operators)

KERNEL_DTYPES = frozenset({"float32", "bfloat16", "float16"})


class DecodeInputs(NamedTuple):
    """One decode step's inputs: x [B, 2M]; params (fp32, :class:`SAMUParams`); state
    (h_r, h_i) fp32 [B, M] or None; consts fp32 [8M + 4] = ``decode_constants(params)``."""

    x: torch.Tensor
    params: SAMUParams
    state: Optional[State]
    consts: torch.Tensor


DecodeOutput = tuple[torch.Tensor, State]


class DecodeCapability(BaseModel):
    """What a decode strategy can run; :meth:`reasons` says why not (as the scan's
    :class:`samu_tune.ops.scan.capability.Capability`).  Decode strategies are forward only and
    deterministic (no atomics)."""

    model_config = ConfigDict(frozen=True)

    dtypes: frozenset[str] = KERNEL_DTYPES
    devices: frozenset[str] = frozenset({"cuda"})
    triton: bool = True
    deterministic: bool = True

    def reasons(self, problem: DecodeProblem, device: Optional[DeviceInfo] = None) -> list[str]:
        out = []
        if problem.dtype not in self.dtypes:
            out.append(f"dtype {problem.dtype} not in {sorted(self.dtypes)}")
        return out + device_reasons(problem.device, self.devices, self.triton, device)


# ---- strategies ------------------------------------------------------------------------------

def valid(problem: DecodeProblem, cfg: decode.DecodeConfig) -> bool:
    """Tiles no larger than needed: BLOCK_M <= next_pow2(M) and BLOCK_D <= next_pow2(2M + 1)
    (the smallest choice always stays; larger tiles only add masked lanes).  The kernels loop
    over mode tiles and width tiles, so any tile size is correct."""
    return (cfg.block_m <= max(16, intmath.next_power_of_2(problem.M))
            and cfg.block_d <= max(64, intmath.next_power_of_2(2 * problem.M + 1)))


def _kernel_run(name: str):
    def run(inputs: DecodeInputs, cfg: decode.DecodeConfig) -> DecodeOutput:
        B, M = inputs.x.shape[0], inputs.params.modes
        plan = decode.launch_plan(name, cfg, B, M, inputs.state is not None)
        return decode._launch(plan, inputs.x, inputs.consts, inputs.state, None, None)
    return run


def _reference_run(inputs: DecodeInputs, cfg) -> DecodeOutput:
    return decode._reference(inputs.x, inputs.params, inputs.state, None, None)


_MODULES = (sys.modules[__name__], decode, kernels)
for _name, _priority, _what in (
        ("single", 10, "one program per batch row walks every mode tile: one launch, best "
                       "when B alone fills the GPU"),
        ("blocked", 5, "one program per (mode tile, row), each recomputing the row's "
                       "controller: small B still spreads over the SMs")):
    register(Strategy(
        name=_name, description=_what, capability=DecodeCapability(),
        run=_kernel_run(_name), config_model=decode.DecodeConfig, valid=valid,
        default=lambda p, n=_name: decode.default_config(n, p.M), priority=_priority,
        modules=_MODULES, op="decode"))

register(Strategy(
    name="reference", description="torch step_reference; any device, float64-capable",
    capability=DecodeCapability(dtypes=KERNEL_DTYPES | {"float64"},
                                devices=frozenset({"cpu", "cuda"}), triton=False),
    run=_reference_run, priority=-100, modules=(sys.modules[__name__],), op="decode"))


def tiles_rule(problem: DecodeProblem, eligible: list[Strategy]) -> Optional[tuple[str, str]]:
    """The untuned choice between the kernels: :func:`samu_tune.ops.decode.step.rule_name`."""
    name = decode.rule_name(problem.M)
    return name, (f"blocked when M spans more than one mode tile, else single "
                  f"(B={problem.B}, M={problem.M})")


# ---- the op spec -----------------------------------------------------------------------------

def random_inputs(problem: DecodeProblem, *, seed: int = 0,
                  device: Optional[str] = None) -> DecodeInputs:
    """x ~ 1.5 N(0,1) in the problem's dtype; directions ~ N(0,1) [2M+1]; amplitudes 0.8 and
    -1.1; nu in [0.02, 1], theta in [0.1, 3] (log-uniform as the scan's inputs); state ~ N(0,1)
    fp32 [B, M] when given.  Drawn in float64 on the CPU from ``seed``, then moved."""
    device = device or problem.device
    B, M = problem.B, problem.M
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    def log_uniform(lo, hi):
        return (torch.rand(M, generator=g, dtype=torch.float64) * (hi - lo) + lo).log()

    f32 = torch.float32
    params = SAMUParams(
        phase_direction=randn(2 * M + 1), radial_direction=randn(2 * M + 1),
        phase_amplitude=torch.tensor(0.8, dtype=torch.float64),
        radial_amplitude=torch.tensor(-1.1, dtype=torch.float64),
        nu_log=log_uniform(0.02, 1.0), theta_log=log_uniform(0.1, 3.0))
    params = SAMUParams(*(p.to(f32).to(device) for p in params))
    x = randn(B, 2 * M, scale=1.5).to(TORCH_DTYPES[problem.dtype]).to(device)
    state = (randn(B, M).to(f32).to(device), randn(B, M).to(f32).to(device)) \
        if problem.initial_state else None
    return DecodeInputs(x, params, state, decode.decode_constants(params))


def expected(inputs: DecodeInputs, problem: DecodeProblem, *, seed: int = 0) -> DecodeOutput:
    """:func:`step_reference` in float64 on the same (already rounded) inputs."""
    f64 = torch.float64
    state = None if inputs.state is None else tuple(s.to(f64) for s in inputs.state)
    with torch.no_grad():
        return step_reference(inputs.x.to(f64), inputs.params.to(f64), state)


def verify(run, inputs: DecodeInputs, problem: DecodeProblem, *, seed: int = 0,
           reference: Optional[DecodeOutput] = None) -> Optional[str]:
    """None when ``run(inputs)``'s y, h_r, h_i match the float64 reference within
    ``TOLERANCES[dtype].forward``, else the reasons."""
    if reference is None:
        reference = expected(inputs, problem, seed=seed)
    want_y, (want_r, want_i) = reference
    with torch.no_grad():
        y, state = run(inputs)
    tol = TOLERANCES[problem.dtype].forward
    reasons = []
    if y.dtype != inputs.x.dtype:
        reasons.append(f"y: dtype {y.dtype} != x's {inputs.x.dtype}")
    for name, got, want in (("y", y, want_y), ("h_r", state[0], want_r),
                            ("h_i", state[1], want_i)):
        reason = check(name, got, want, tol)
        if reason:
            reasons.append(reason)
    return "; ".join(reasons) if reasons else None


def verification_problem(problem: DecodeProblem, strategy: Strategy, config: BaseModel,
                         device: Optional[DeviceInfo] = None) -> DecodeProblem:
    """At most two rows at the real M (kernels take B and M at runtime: same binary)."""
    small = problem.model_copy(update={"B": min(problem.B, 2)})
    if not strategy.reasons(small, device) and (
            strategy.valid is None or strategy.valid(small, config)):
        return small
    return problem


class DecodeStep(timing.PoolStep):
    """The decode op's timed call: ``fn(inputs)`` under ``no_grad`` on a pool of input sets."""

    def __init__(self, problem: DecodeProblem, device: torch.device | str, *, pool: int = 2,
                 seed: int = 1000):
        super().__init__(device)
        self.problem = problem
        self.pools = [random_inputs(problem, seed=seed + i, device=str(self.device))
                      for i in range(max(1, pool))]

    def __call__(self, fn, inputs: DecodeInputs) -> DecodeOutput:
        with torch.no_grad():
            return fn(inputs)


def input_bytes(problem: DecodeProblem) -> int:
    """x and y ([B, 2M] each) plus the fp32 state read and written ([B, M] x 2 each)."""
    item = torch.empty((), dtype=TORCH_DTYPES[problem.dtype]).element_size()
    return 2 * problem.B * 2 * problem.M * item + 4 * problem.B * problem.M * 4


def finite(out: DecodeOutput) -> bool:
    y, state = out
    return all(bool(torch.isfinite(t).all()) for t in (y, *state))


def without_state(problem: DecodeProblem) -> Optional[tuple[DecodeProblem, str]]:
    """The same step from a zero state: the state read is [B, M] beside the same x, y and
    controller work, so that winner is the best guess with a state."""
    if not problem.initial_state:
        return None
    return problem.model_copy(update={"initial_state": False}), "without state"


SPEC = register_op(OpSpec(
    op="decode", problem_type=DecodeProblem, random_inputs=random_inputs, expected=expected,
    verify=verify, verification_problem=verification_problem, make_step=DecodeStep,
    input_bytes=input_bytes, finite=finite, rules=[tiles_rule], relax=without_state))

__all__ = ["DecodeInputs", "DecodeCapability", "SPEC", "valid", "tiles_rule"]
