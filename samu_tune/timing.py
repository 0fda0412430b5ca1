"""Timing helpers of the tuner: fast input pools, an L2 flush, and the two clocks.

- On CUDA a sample is the device-event time of one call, taken right after a write of a
  buffer larger than L2 (so no input is served from a warm cache) and on the next input set of
  a small pool of fresh random inputs; the statistic is the median.
- On the CPU (the Triton interpreter, or the torch reference) a sample is wall time from
  :func:`now`; results carry ``timing="cpu-wall"`` and are never mixed with GPU ones.

:func:`now` is the CPU clock; tests replace it to make fake strategies' costs exact.
:func:`copy_bandwidth` is the device's copy speed, the yardstick of the CLI's bandwidth column.
"""
from __future__ import annotations

import statistics
import time
from functools import lru_cache
from typing import Callable, Literal, Optional, Sequence

import torch

from .problem import TORCH_DTYPES, ScanProblem
from .tensors import ScanInputs, ScanOutput

TimingKind = Literal["cuda-events", "cpu-wall"]

now: Callable[[], float] = time.perf_counter


def timing_kind(problem: ScanProblem) -> TimingKind:
    return "cuda-events" if problem.device == "cuda" else "cpu-wall"


def fast_random_inputs(problem: ScanProblem, *, seed: int, device: torch.device | str,
                       reset_rate: float = 0.15) -> ScanInputs:
    """Random inputs with the distribution of :func:`samu_tune.verify.random_inputs`, generated
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


class Step:
    """One timed call: forward, or forward + backward of every differentiable input.

    Holds a pool of input sets (rotated so consecutive samples read different memory) and,
    in train mode, fixed upstream gradients.
    """

    def __init__(self, problem: ScanProblem, device: torch.device | str, *, pool: int = 2,
                 seed: int = 1000):
        self.problem = problem
        self.device = torch.device(device)
        self.pools: list[ScanInputs] = []
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
        self._i = 0

    def next_inputs(self) -> ScanInputs:
        self._i = (self._i + 1) % len(self.pools)
        return self.pools[self._i]

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


_FLUSH: dict[torch.device, torch.Tensor] = {}


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer of twice the device's L2 (at least 64 MiB); writing it evicts L2."""
    if device not in _FLUSH:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        nbytes = max(2 * l2, 64 << 20)
        _FLUSH[device] = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    return _FLUSH[device]


def sample(step: Step, fn: Callable[[ScanInputs], ScanOutput], n: int) -> list[float]:
    """``n`` timings (milliseconds) of ``step(fn, fresh inputs)``."""
    if step.device.type == "cuda":
        return _cuda_samples(step, fn, n)
    out = []
    for _ in range(n):
        inputs = step.next_inputs()
        t0 = now()
        step(fn, inputs)
        out.append((now() - t0) * 1e3)
    return out


def _cuda_samples(step: Step, fn, n: int) -> list[float]:
    flush = l2_flush_buffer(step.device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for start, end in events:
        inputs = step.next_inputs()
        flush.zero_()
        start.record()
        step(fn, inputs)
        end.record()
    torch.cuda.synchronize(step.device)
    return [start.elapsed_time(end) for start, end in events]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def reps_for(estimate_ms: float, *, device: torch.device, target_ms: Optional[float] = None,
             lo: int = 3, hi: int = 50) -> int:
    """How many samples fit ``target_ms`` given one call's ``estimate_ms``."""
    if target_ms is None:
        target_ms = 100.0 if device.type == "cuda" else 50.0
    if estimate_ms <= 0:
        return hi
    return max(lo, min(hi, int(target_ms / estimate_ms)))


@lru_cache(maxsize=None)
def copy_bandwidth(device_index: int = 0, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Bytes per second of ``dst.copy_(src)`` on one CUDA device (read + write counted).

    ``nbytes`` per buffer (capped at an eighth of the free memory), median of ``reps`` timed
    copies after a warm-up.
    """
    device = torch.device("cuda", device_index)
    free, _ = torch.cuda.mem_get_info(device)
    n = max(1 << 20, min(nbytes, free // 8)) // 16 * 16
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(3):
        dst.copy_(src)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        dst.copy_(src)
        end.record()
    torch.cuda.synchronize(device)
    ms = statistics.median(s.elapsed_time(e) for s, e in events)
    del src, dst
    return 2 * n / (ms * 1e-3)
