"""The SAMU layer as a tuned op: strategies ``unfused``, ``fused``, ``reference`` and its
:class:`samu_tune.opspec.OpSpec`.

A :class:`~samu_tune.ops.layer.problem.LayerProblem` (the layer's scan problem: B, L, M, dtype, resets,
initial state, forward or train) is tuned like a scan problem
(``samu_tune.tune(LayerProblem(...))``), its winner stored in the cache under ``layer:<key>``,
and ``SAMU(strategy="auto")`` resolves through the cache, the shipped table, then the rule
(``fused`` where eligible: about 3x faster than ``unfused`` on the H200, see
docs/performance.md; the fused path itself falls back to the unfused one for a call it cannot
run, e.g. M <= 64).

A strategy runs on :class:`LayerInputs` and returns ``(y [B, L, 2M] in x's dtype, final state
(h_r, h_i) fp32 [B, M])``.  Verification runs the layer's forward and, in train mode, every
gradient (x, initial state, each parameter) against the float64
:func:`samu_tune.ops.layer.reference.layer_reference`, on a small problem in **float32**: in bf16
the controller's parameter gradients sum rounded terms with cancellation, and the unfused path
itself sits 6-10% off the float64 reference at modest sizes, so a bf16 comparison cannot tell
a bug from rounding (the strategies' bf16 binaries are checked at the real shape for finite
outputs, and tests/test_layer.py compares fused and unfused bf16 gradients).
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune import timing
from samu_tune.device import DeviceInfo
from samu_tune.opspec import OpSpec, register_op
from samu_tune.problem import TORCH_DTYPES
from samu_tune.ops.layer.problem import LayerProblem
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.registry import Strategy, device_reasons, register
from samu_tune.tolerances import check_all
from samu_tune.kernels import controller as kernel_controller
from samu_tune.ops.layer import controller, fused, fused_autograd, unfused
from samu_tune.ops.scan.strategies import lookback
from samu_tune.ops.layer.reference import SAMUParams, State, layer_reference
from samu_tune.ops.layer import library  # noqa: F401  (registers the samu_tune::* operators)

PARAM_NAMES = ("phase_direction", "radial_direction", "phase_amplitude", "radial_amplitude",
               "nu_log", "theta_log")


class LayerInputs(NamedTuple):
    """One layer call: x [B, L, 2M]; params (fp32 :class:`SAMUParams`); state fp32 [B, M] pair
    or None; segment_pos int [B, L] or None."""

    x: torch.Tensor
    params: SAMUParams
    state: Optional[State]
    segment_pos: Optional[torch.Tensor]

    def leaves(self) -> tuple[torch.Tensor, ...]:
        """Everything a gradient flows to: x, the state (when given), the parameters."""
        return (self.x, *(self.state or ()), *self.params)


LayerOutput = tuple[torch.Tensor, State]


def scan_problem_of(problem: LayerProblem) -> ScanProblem:
    """The scan inside the layer: the same fields, always with the final state."""
    fields = problem.model_dump()
    fields["final_state"] = True
    return ScanProblem(**fields)


class LayerCapability(BaseModel):
    """What a layer strategy can run; :meth:`reasons` says why not.  ``fused_io``: the fused
    kernels' own limits (a loop-inner look-back config must exist for the layer's scan)."""

    model_config = ConfigDict(frozen=True)

    dtypes: frozenset[str] = frozenset({"float32", "bfloat16", "float16"})
    devices: frozenset[str] = frozenset({"cuda"})
    triton: bool = True
    fused_io: bool = False
    deterministic: bool = True

    def reasons(self, problem: LayerProblem, device: Optional[DeviceInfo] = None) -> list[str]:
        out = []
        if problem.dtype not in self.dtypes:
            out.append(f"dtype {problem.dtype} not in {sorted(self.dtypes)}")
        out += device_reasons(problem.device, self.devices, self.triton, device)
        if self.fused_io and not out and fused.config_for_problem(
                scan_problem_of(problem)) is None:
            out.append("no loop-inner look-back config for the layer's scan (M <= 64 or "
                       "L <= 16)")
        return out


# ---- strategies ------------------------------------------------------------------------------

def _unfused(inputs: LayerInputs, cfg) -> LayerOutput:
    return unfused.forward(inputs.x, inputs.params, inputs.state, inputs.segment_pos)


def _fused(inputs: LayerInputs, cfg) -> LayerOutput:
    out = fused.forward(inputs.x, inputs.params, inputs.state, inputs.segment_pos)
    if out is None:
        raise RuntimeError("the fused SAMU layer cannot run these inputs "
                           "(see samu_tune.ops.layer.fused)")
    return out


def _reference(inputs: LayerInputs, cfg=None) -> LayerOutput:
    return layer_reference(inputs.x, inputs.params, initial_state=inputs.state,
                           segment_pos=inputs.segment_pos)


_THIS = sys.modules[__name__]
register(Strategy(
    name="unfused", description="controller and write in torch, samu_tune.scan, relu in torch",
    capability=LayerCapability(devices=frozenset({"cpu", "cuda"}), triton=False),
    run=_unfused, priority=10, modules=(_THIS, unfused), op="layer"))
register(Strategy(
    name="fused", description="controller kernels, then write and relu output (and their "
                              "gradients) inside the loop-inner look-back kernels: x read "
                              "once by each, y written once",
    capability=LayerCapability(fused_io=True), run=_fused, priority=5,
    modules=(_THIS, fused, fused_autograd, controller, kernel_controller, lookback,
             *lookback.KERNEL_MODULES), op="layer"))
register(Strategy(
    name="reference", description="torch layer_reference; any device, float64-capable",
    capability=LayerCapability(dtypes=frozenset({"float64", "float32", "bfloat16", "float16"}),
                               devices=frozenset({"cpu", "cuda"}), triton=False),
    run=_reference, priority=-100, modules=(_THIS,), op="layer"))


def fused_where_eligible(problem: LayerProblem, eligible: list[Strategy]
                         ) -> Optional[tuple[str, str]]:
    """The untuned choice: ``fused`` when eligible (measured faster than ``unfused``, see the
    module docstring), else ``unfused``."""
    names = {s.name for s in eligible}
    if "fused" in names:
        return "fused", "fused: it ran the layer 2.7-3.5x faster than unfused on the H200 (rule)"
    if "unfused" in names:
        return "unfused", "unfused: the fused layer is not eligible (rule)"
    return None


# ---- the op spec -----------------------------------------------------------------------------

def random_inputs(problem: LayerProblem, *, seed: int = 0,
                  device: Optional[str] = None) -> LayerInputs:
    """x ~ 1.5 N(0,1) in the problem's dtype; directions ~ N(0,1) [2M+1]; amplitudes 0.8 and
    -1.1; nu in [0.02, 1], theta in [0.1, 3] (log-uniform); resets with probability 0.15 (and
    at t = 0 in some rows); state ~ N(0,1) fp32.  Drawn in float64 on the CPU from ``seed``."""
    device = device or problem.device
    B, L, M = problem.B, problem.L, problem.M
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    def log_uniform(lo, hi):
        return (torch.rand(M, generator=g, dtype=torch.float64) * (hi - lo) + lo).log()

    params = SAMUParams(
        phase_direction=randn(2 * M + 1), radial_direction=randn(2 * M + 1),
        phase_amplitude=torch.tensor(0.8, dtype=torch.float64),
        radial_amplitude=torch.tensor(-1.1, dtype=torch.float64),
        nu_log=log_uniform(0.02, 1.0), theta_log=log_uniform(0.1, 3.0))
    spec = torch.float64 if problem.dtype == "float64" else torch.float32
    params = SAMUParams(*(p.to(spec).to(device) for p in params))
    x = randn(B, L, 2 * M, scale=1.5).to(TORCH_DTYPES[problem.dtype]).to(device)
    seg = None
    if problem.resets:
        starts = torch.rand(B, L, generator=g) < 0.15
        starts[:, 0] |= torch.rand(B, generator=g) < 0.5
        t = torch.arange(L).expand(B, L)
        last = torch.where(starts, t, torch.full_like(t, -8)).cummax(dim=1).values
        seg = (t - last).to(torch.int32).to(device)
    state = ((randn(B, M).to(spec).to(device), randn(B, M).to(spec).to(device))
             if problem.initial_state else None)
    return LayerInputs(x, params, state, seg)


def _leaf_inputs(inputs: LayerInputs, dtype: Optional[torch.dtype] = None) -> LayerInputs:
    def leaf(t):
        t = t.detach().clone() if dtype is None else t.detach().to(dtype)
        return t.requires_grad_(True)
    return LayerInputs(leaf(inputs.x), SAMUParams(*(leaf(p) for p in inputs.params)),
                       None if inputs.state is None else tuple(leaf(s) for s in inputs.state),
                       inputs.segment_pos)


def _upstream(inputs: LayerInputs, seed: int) -> tuple[torch.Tensor, ...]:
    B, L, width = inputs.x.shape
    g = torch.Generator().manual_seed(seed + 1)
    dev = inputs.x.device
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64).to(dev)
                 for shape in ((B, L, width), (B, width // 2), (B, width // 2)))


def _forward_backward(run, inputs: LayerInputs, backward: bool, upstream) -> dict:
    y, (fr, fi) = run(inputs)
    out = {"y": y, "final_r": fr, "final_i": fi}
    if backward:
        loss = ((y.double() * upstream[0]).sum() + (fr.double() * upstream[1]).sum()
                + (fi.double() * upstream[2]).sum())
        names = ["x", *(("h0_r", "h0_i") if inputs.state is not None else ()), *PARAM_NAMES]
        grads = torch.autograd.grad(loss, inputs.leaves(), allow_unused=True)
        out.update({"grad_" + n: g for n, g in zip(names, grads)})
    return out


def expected(inputs: LayerInputs, problem: LayerProblem, *, seed: int = 0) -> dict:
    """The float64 layer reference's y, final state and (train) every gradient, under an
    upstream gradient drawn from ``seed``."""
    return _forward_backward(_reference, _leaf_inputs(inputs, torch.float64), problem.backward,
                             _upstream(inputs, seed))


def verify(run, inputs: LayerInputs, problem: LayerProblem, *, seed: int = 0,
           reference: Optional[dict] = None) -> Optional[str]:
    """None when ``run(inputs)`` matches the float64 reference (forward, and in train mode every
    gradient) within ``TOLERANCES[dtype]``, else the reasons."""
    if reference is None:
        reference = expected(inputs, problem, seed=seed)
    got = _forward_backward(run, _leaf_inputs(inputs), problem.backward,
                            _upstream(inputs, seed))
    return check_all(got, reference, problem.dtype)


def verification_problem(problem: LayerProblem, strategy: Strategy, config: BaseModel,
                         device: Optional[DeviceInfo] = None) -> LayerProblem:
    """B <= 2, L <= 48 (else 32 + L % 16), M <= 80 (else 72, or 65 + M % 8: ragged M stays
    ragged, and M > 64 keeps the fused path eligible), float32 (see the module docstring);
    the real problem when the strategy cannot run the small one."""
    L = problem.L if problem.L <= 48 else 32 + problem.L % 16
    M = problem.M if problem.M <= 80 else (72 if problem.M % 8 == 0 else 65 + problem.M % 8)
    dtype = "float64" if problem.dtype == "float64" else "float32"
    small = problem.model_copy(update=dict(B=min(problem.B, 2), L=L, M=M, dtype=dtype))
    if not strategy.reasons(small, device) and (
            strategy.valid is None or strategy.valid(small, config)):
        return small
    return problem


class LayerStep(timing.AutogradStep):
    """The layer op's timed call: forward, or forward + backward of x, the state and every
    parameter under fixed upstream gradients, on a pool of input sets."""

    inputs = staticmethod(random_inputs)
    leaves = staticmethod(_leaf_inputs)
    upstream = staticmethod(_upstream)

    @staticmethod
    def outputs(result: LayerOutput) -> list[torch.Tensor]:
        y, (fr, fi) = result
        return [y, fr, fi]


def input_bytes(problem: LayerProblem) -> int:
    """x and y [B, L, 2M] (and, training, their gradients), the fp32 states [B, M]."""
    item = TORCH_DTYPES[problem.dtype].itemsize
    per = 2 * problem.B * problem.L * 2 * problem.M * item + 4 * problem.B * problem.M * 4
    return per * (2 if problem.backward else 1)


def finite(out: LayerOutput) -> bool:
    y, state = out
    return all(bool(torch.isfinite(t).all()) for t in (y, *state))


SPEC = register_op(OpSpec(
    op="layer", problem_type=LayerProblem, random_inputs=random_inputs, expected=expected,
    verify=verify, verification_problem=verification_problem, make_step=LayerStep,
    input_bytes=input_bytes, finite=finite, rules=[fused_where_eligible], relax=None,
    # a layer candidate's look-back config comes from the scan's dispatch on its tensors'
    # device (fused: the loop-inner pick; unfused: samu_tune.scan), which in a compile worker
    # is the CPU's, not the GPU's: its binaries would not be the ones the GPU run loads
    compiles_ahead=False))

__all__ = ["LayerInputs", "LayerCapability", "SPEC", "scan_problem_of"]
