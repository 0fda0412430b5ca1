"""Random inputs for a problem, and a candidate's check against the float64 reference.

Used by the tuner before timing a candidate and by the registry-generated tests.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from pydantic import BaseModel

from samu_tune.problem import TORCH_DTYPES
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.ops.scan.tensors import ScanInputs
from samu_tune.tolerances import check_all


def random_inputs(problem: ScanProblem, *, seed: int = 0, device: Optional[str] = None,
                  reset_rate: float = 0.15) -> ScanInputs:
    """Random (never zero) inputs shaped and typed like ``problem``.

    eta ~ 0.5 N(0,1), delta ~ 0.5 N(0,1); nu = exp(nu_log) in [0.02, 1]; theta in [0.1, 3];
    writes ~ N(0,1); resets start a segment with probability ``reset_rate`` (and sometimes at
    t = 0); h0 ~ N(0,1).
    """
    device = device or problem.device
    B, L, M = problem.B, problem.L, problem.M
    g = torch.Generator().manual_seed(seed)
    ctl, wdt = TORCH_DTYPES[problem.control_dtype], TORCH_DTYPES[problem.dtype]
    spec = torch.float64 if problem.dtype == "float64" else torch.float32

    def randn(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    def uniform(lo, hi, n):
        return (torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo)

    segment_pos = None
    if problem.resets:
        starts = torch.rand(B, L, generator=g) < reset_rate
        starts[:, 0] |= torch.rand(B, generator=g) < 0.5
        pos = torch.zeros(B, L, dtype=torch.int64)
        for t in range(L):
            prev = pos[:, t - 1] + 1 if t > 0 else torch.full((B,), 7, dtype=torch.int64)
            pos[:, t] = torch.where(starts[:, t], torch.zeros_like(prev), prev)
        segment_pos = pos.to(torch.int32).to(device)
    h0 = None
    if problem.initial_state:
        h0 = (randn(B, M, dtype=spec), randn(B, M, dtype=spec))
    return ScanInputs(
        eta=randn(B, L, scale=0.5, dtype=ctl), delta=randn(B, L, scale=0.5, dtype=ctl),
        nu_log=uniform(0.02, 1.0, M).log().to(spec).to(device),
        theta_log=uniform(0.1, 3.0, M).log().to(spec).to(device),
        br=randn(B, L, M, dtype=wdt), bi=randn(B, L, M, dtype=wdt),
        initial_state=h0, segment_pos=segment_pos, output_final_state=problem.final_state)


def _with_grad(inputs: ScanInputs, dtype: Optional[torch.dtype] = None) -> ScanInputs:
    def leaf(t):
        t = t.detach().clone() if dtype is None else t.detach().to(dtype)
        return t.requires_grad_(True)
    h0 = inputs.initial_state
    return inputs.replace(
        eta=leaf(inputs.eta), delta=leaf(inputs.delta), nu_log=leaf(inputs.nu_log),
        theta_log=leaf(inputs.theta_log), br=leaf(inputs.br), bi=leaf(inputs.bi),
        initial_state=None if h0 is None else (leaf(h0[0]), leaf(h0[1])))


_GRAD_NAMES = ("eta", "delta", "nu_log", "theta_log", "br", "bi", "h0_r", "h0_i")


def _forward_backward(fn, inputs: ScanInputs, backward: bool, upstream):
    out = fn(inputs)
    results = {"real": out.real, "imag": out.imag}
    if inputs.output_final_state:
        if out.final_state is None:
            results["final_r"] = results["final_i"] = None
        else:
            results["final_r"], results["final_i"] = out.final_state
    if backward:
        g_r, g_i, g_fr, g_fi = upstream
        loss = (out.real.double() * g_r).sum() + (out.imag.double() * g_i).sum()
        if inputs.output_final_state and out.final_state is not None:
            loss = loss + (out.final_state[0].double() * g_fr).sum() \
                + (out.final_state[1].double() * g_fi).sum()
        leaves = inputs.differentiable()
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        results.update({"grad_" + n: g for n, g in zip(_GRAD_NAMES, grads)})
    return results


class Expected(NamedTuple):
    """The float64 reference's outputs (and gradients) on some inputs, under ``upstream``."""

    upstream: tuple[torch.Tensor, ...]
    want: dict


def expected(inputs: ScanInputs, problem: ScanProblem, *, seed: int = 0) -> Expected:
    """What :func:`verify` compares against: the float64 reference forward and (when
    ``problem.backward``) every gradient under a random upstream gradient (from ``seed``).
    Computed once per inputs, it serves every candidate verified on them (the reference is a
    loop over L: a tenth of a second per candidate in a tune on the H200)."""
    B, L, M = inputs.shape
    g = torch.Generator().manual_seed(seed + 1)
    dev = inputs.br.device
    upstream = tuple(torch.randn(*shape, generator=g, dtype=torch.float64).to(dev)
                     for shape in ((B, L, M), (B, L, M), (B, M), (B, M)))

    def ref(inp: ScanInputs):
        return scan_reference(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi,
                              initial_state=inp.initial_state, segment_pos=inp.segment_pos,
                              output_final_state=inp.output_final_state, dtype=torch.float64)
    want = _forward_backward(ref, _with_grad(inputs, torch.float64), problem.backward, upstream)
    return Expected(upstream, want)


def verify(run, inputs: ScanInputs, problem: ScanProblem, *, seed: int = 0,
           reference: Optional[Expected] = None) -> Optional[str]:
    """Compare ``run(inputs) -> ScanOutput`` with the float64 reference, forward and (when
    ``problem.backward``) every gradient, under an upstream gradient on the outputs and on the
    final state.  Returns None when all match within :data:`TOLERANCES`, else the reasons.
    ``reference``: :func:`expected` of the same inputs, problem and seed (computed when None).
    """
    if reference is None:
        reference = expected(inputs, problem, seed=seed)
    upstream, want = reference
    got = _forward_backward(run, _with_grad(inputs), problem.backward, upstream)
    return check_all(got, want, problem.dtype)


def verify_strategy(strategy, cfg: BaseModel, problem: ScanProblem, *, seed: int = 0,
                    device: Optional[str] = None) -> Optional[str]:
    """:func:`verify` of ``strategy`` at ``cfg`` on fresh random inputs for ``problem``."""
    inputs = random_inputs(problem, seed=seed, device=device)
    return verify(lambda inp: strategy.run(inp, cfg), inputs, problem, seed=seed)
