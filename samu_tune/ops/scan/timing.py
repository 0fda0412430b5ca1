"""The scan's timed call for the tuner (:class:`Step`, on :class:`samu_tune.timing.PoolStep`)
and its input pool: random inputs generated on the device, their size in bytes."""
from __future__ import annotations

from typing import Callable

import torch

from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune.problem import TORCH_DTYPES
from samu_tune.timing import PoolStep


def fast_random_inputs(problem: ScanProblem, *, seed: int, device: torch.device | str,
                       reset_rate: float = 0.15) -> ScanInputs:
    """Random inputs with the distribution of :func:`samu_tune.ops.scan.verify.random_inputs`, generated
    directly on ``device`` (no float64 host copy, no Python loop over L), for timing at real
    shapes.  Same seed, same values on the same device.
    """
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    B, L, M = problem.B, problem.L, problem.M
    ctl, wdt = TORCH_DTYPES[problem.control_dtype], TORCH_DTYPES[problem.dtype]
    spec = torch.float64 if problem.dtype == "float64" else torch.float32

    def randn(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    def log_uniform(lo, hi, n):
        return (torch.rand(n, generator=g, device=device) * (hi - lo) + lo).log().to(spec)

    segment_pos = None
    if problem.resets:
        starts = torch.rand(B, L, generator=g, device=device) < reset_rate
        starts[:, 0] |= torch.rand(B, generator=g, device=device) < 0.5
        t = torch.arange(L, device=device).expand(B, L)
        # position = t - (last start at or before t); a row without a start so far continues
        # a segment that began 7 steps before t = 0, as in random_inputs
        last = torch.where(starts, t, torch.full_like(t, -7)).cummax(dim=1).values
        segment_pos = (t - last).to(torch.int32)
    h0 = (randn(B, M, dtype=spec), randn(B, M, dtype=spec)) if problem.initial_state else None
    return ScanInputs(
        eta=randn(B, L, scale=0.5, dtype=ctl), delta=randn(B, L, scale=0.5, dtype=ctl),
        nu_log=log_uniform(0.02, 1.0, M), theta_log=log_uniform(0.1, 3.0, M),
        br=randn(B, L, M, dtype=wdt), bi=randn(B, L, M, dtype=wdt),
        initial_state=h0, segment_pos=segment_pos, output_final_state=problem.final_state)


def input_bytes(problem: ScanProblem) -> int:
    """Bytes of one input set plus its outputs (and, in train mode, gradients)."""
    item = torch.empty((), dtype=TORCH_DTYPES[problem.dtype]).element_size()
    per_set = 2 * problem.elements * item * 2          # br, bi and out_r, out_i
    if problem.backward:
        per_set *= 2                                   # upstream and input gradients
    return per_set


class Step(PoolStep):
    """The scan's timed call: forward, or forward + backward of every differentiable input.

    Holds a pool of input sets (rotated so consecutive samples read different memory) and,
    in train mode, fixed upstream gradients.
    """

    def __init__(self, problem: ScanProblem, device: torch.device | str, *, pool: int = 2,
                 seed: int = 1000):
        super().__init__(device)
        self.problem = problem
        for i in range(max(1, pool)):
            inputs = fast_random_inputs(problem, seed=seed + i, device=self.device)
            if problem.backward:
                inputs = _leaves(inputs)
            self.pools.append(inputs)
        self.upstream = None
        if problem.backward:
            g = torch.Generator(device=self.device).manual_seed(seed - 1)
            dt = TORCH_DTYPES[problem.dtype]
            shape = (problem.B, problem.L, problem.M)
            self.upstream = (torch.randn(shape, generator=g, device=self.device).to(dt),
                             torch.randn(shape, generator=g, device=self.device).to(dt),
                             torch.randn(problem.B, problem.M, generator=g, device=self.device),
                             torch.randn(problem.B, problem.M, generator=g, device=self.device))

    def __call__(self, fn: Callable[[ScanInputs], ScanOutput], inputs: ScanInputs) -> ScanOutput:
        if not self.problem.backward:
            with torch.no_grad():
                return fn(inputs)
        out = fn(inputs)
        outs, grads = [out.real, out.imag], [self.upstream[0], self.upstream[1]]
        if self.problem.final_state and out.final_state is not None:
            outs += list(out.final_state)
            grads += [self.upstream[2].to(out.final_state[0].dtype),
                      self.upstream[3].to(out.final_state[1].dtype)]
        torch.autograd.grad(outs, inputs.differentiable(), grads, allow_unused=True)
        return out


def _leaves(inputs: ScanInputs) -> ScanInputs:
    def leaf(t):
        return t.detach().requires_grad_(True)
    h0 = inputs.initial_state
    return inputs.replace(
        eta=leaf(inputs.eta), delta=leaf(inputs.delta), nu_log=leaf(inputs.nu_log),
        theta_log=leaf(inputs.theta_log), br=leaf(inputs.br), bi=leaf(inputs.bi),
        initial_state=None if h0 is None else (leaf(h0[0]), leaf(h0[1])))
