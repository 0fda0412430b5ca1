"""Timing helpers of the tuner: the timed call's base (:class:`PoolStep`; each op's own is in
its package), an L2 flush, and the two clocks.

**CUDA: GPU time only.**  A sample is the device-event time of one call (``start`` recorded
before it, ``end`` after), taken right after a write of a buffer larger than L2 (so no input is
served from a warm cache) and on the next input set of a small pool of fresh random inputs; the
statistic is the median.  The events time the GPU's stream, so the GPU must never wait for the
host inside ``[start, end]``: a call's host side (Python dispatch, autograd, Triton's launch of
a many-argument kernel: 0.1-0.9 ms per call on an H200) can be longer than its kernels at
small shapes, and a plain "flush, record, call, record" then times the host
(docs/performance.md).  So every sample is enqueued behind a GPU busy-wait
(``torch.cuda._sleep``): with the stream idle (synchronised before each sample)::

    host:  sleep(S) | flush | record start | call ........... | record end
    GPU:            [------------ S -------------][flush] start [kernels] end

and ``S`` is longer than the host's enqueue of flush + start + call + end, so the whole call is
queued before the GPU reaches ``start`` and ``end - start`` is the kernels' time alone.

- ``S = min(SLEEP_CAP_MS, SLEEP_FACTOR * host + SLEEP_MARGIN_MS)`` where ``host`` is the
  largest of the call's last :data:`HOST_WINDOW` measured host times (ms; the first estimate is
  the faster of two untimed calls, so a compile in the first one does not count).
- ``S`` is converted to clock cycles with the device's cycles per millisecond, calibrated once
  per device (:func:`calibrate`: event-timed ``_sleep`` of a known cycle count; the highest rate
  seen is kept so a sleep is never shorter than asked).
- A sample whose host enqueue (sleep to end record) took longer than ``S`` is "late" (the GPU
  may have idled inside the window): it is taken again once with the raised estimate.
- Each sample also records the call's host time (wall time of the call, not synchronised):
  :func:`host_ms` reports it beside the GPU time (the tuner's ``Candidate.host_ms``).  The
  two together say whether a call is GPU-bound (host < GPU) or launch-bound.

**CPU** (the Triton interpreter, or the torch reference): a sample is wall time from
:func:`now`; results carry ``timing="cpu-wall"`` and are never mixed with GPU ones.

:func:`now` is the CPU clock; tests replace it to make fake strategies' costs exact, and
:func:`gpu_samples` takes a :class:`Gpu` so tests can drive it with a simulated stream.
:func:`copy_bandwidth` is the device's copy speed, the yardstick of the CLI's bandwidth column.
"""
from __future__ import annotations

import statistics
import time
import weakref
from functools import lru_cache
from typing import Callable, Literal, Optional, Sequence

import torch


TimingKind = Literal["cuda-events", "cpu-wall"]

now: Callable[[], float] = time.perf_counter


def timing_kind(problem) -> TimingKind:
    """``cuda-events`` for a CUDA problem (any op), else ``cpu-wall``."""
    return "cuda-events" if problem.device == "cuda" else "cpu-wall"


class PoolStep:
    """What :func:`sample` needs of a timed call, for any op: ``device``, a pool of input sets
    rotated by :meth:`next_inputs` (consecutive samples read different memory), the record of
    each timed fn's host times, and ``step(fn, inputs)`` (defined by each op's step)."""

    device: torch.device
    pools: list

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.pools = []
        self._i = 0
        # host times (ms) of each timed fn, for the busy-wait and host_ms
        self._host: "weakref.WeakKeyDictionary[Callable, list[float]]" = \
            weakref.WeakKeyDictionary()

    def host_times(self, fn: Callable) -> list[float]:
        """The record of ``fn``'s host times on this step (see :func:`gpu_samples`)."""
        return self._host.setdefault(fn, [])

    def next_inputs(self):
        self._i = (self._i + 1) % len(self.pools)
        return self.pools[self._i]

    def __call__(self, fn: Callable, inputs):
        raise NotImplementedError


class AutogradStep(PoolStep):
    """The timed call of an op whose strategies are differentiable torch functions of their
    inputs: forward (under ``no_grad``), or forward + backward of every leaf
    (``inputs.leaves()``) under fixed upstream gradients.  An op subclasses it with
    ``inputs(problem, seed=, device=)``, ``leaves(inputs)`` (the same inputs as fresh leaves
    requiring grad), ``upstream(inputs, seed)`` (one gradient per output) and
    ``outputs(result)`` (the differentiable outputs, in ``upstream``'s order)."""

    inputs: Callable
    leaves: Callable
    upstream: Callable
    outputs: Callable

    def __init__(self, problem, device: torch.device | str, *, pool: int = 2,
                 seed: int = 1000):
        super().__init__(device)
        self.problem = problem
        for i in range(max(1, pool)):
            inp = type(self).inputs(problem, seed=seed + i, device=str(self.device))
            self.pools.append(type(self).leaves(inp) if problem.backward else inp)
        self.grads = type(self).upstream(self.pools[0], seed) if problem.backward else None

    def __call__(self, fn: Callable, inputs):
        if not self.problem.backward:
            with torch.no_grad():
                return fn(inputs)
        result = fn(inputs)
        outs = type(self).outputs(result)
        torch.autograd.grad(outs, inputs.leaves(),
                            [g.to(o.dtype) for g, o in zip(self.grads, outs)],
                            allow_unused=True)
        return result


_FLUSH: dict[torch.device, torch.Tensor] = {}


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer of twice the device's L2 (at least 64 MiB); writing it evicts L2."""
    if device not in _FLUSH:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        nbytes = max(2 * l2, 64 << 20)
        _FLUSH[device] = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    return _FLUSH[device]


SLEEP_FACTOR = 1.5        # host enqueue times jitter; the sleep covers 1.5x the slowest recent
SLEEP_MARGIN_MS = 0.05    # launch latency of the sleep itself, flush and event records
SLEEP_CAP_MS = 20.0       # a call whose host side is slower than this is timed as it comes
HOST_WINDOW = 8           # recent host times the sleep estimate looks at
CALIBRATION_CYCLES = 2_000_000   # ~1 ms at H200 clocks


class Gpu:
    """The CUDA operations of one sample on one device (tests substitute a simulated stream).

    ``cycles_per_ms`` is the device's ``_sleep`` rate (:func:`calibrate`, once per device);
    ``late`` counts samples kept although late (twice, or once at the cap; see
    :func:`gpu_samples`).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cycles_per_ms: Optional[float] = None
        self.late = 0

    def sleep(self, cycles: int) -> None:
        with torch.cuda.device(self.device):
            torch.cuda._sleep(int(cycles))

    def flush(self) -> None:
        l2_flush_buffer(self.device).zero_()

    def event(self):
        """An event with ``record()`` and ``elapsed_time(other)`` (ms)."""
        return torch.cuda.Event(enable_timing=True)

    def record(self, event) -> None:
        event.record(torch.cuda.current_stream(self.device))

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


_GPUS: dict[torch.device, Gpu] = {}


def gpu_for(device: torch.device | str) -> Gpu:
    """The (calibrated) :class:`Gpu` of a CUDA device, one per device and process."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _GPUS:
        gpu = Gpu(device)
        calibrate(gpu)
        _GPUS[device] = gpu
    return _GPUS[device]


def calibrate(gpu: Gpu, cycles: int = CALIBRATION_CYCLES, reps: int = 5) -> float:
    """Set and return ``gpu.cycles_per_ms``: ``cycles / elapsed_ms`` of event-timed sleeps of
    ``cycles`` cycles (after an untimed sleep ten times as long that raises the clocks); the
    highest of ``reps`` rates, so that a sleep computed from it lasts at least as long as
    intended."""
    gpu.sync()
    gpu.sleep(10 * cycles)
    rates = []
    for _ in range(reps):
        start, end = gpu.event(), gpu.event()
        gpu.record(start)
        gpu.sleep(cycles)
        gpu.record(end)
        gpu.sync()
        ms = start.elapsed_time(end)
        if ms > 0:
            rates.append(cycles / ms)
    if not rates:
        raise RuntimeError("cannot calibrate torch.cuda._sleep: every sleep timed 0 ms")
    gpu.cycles_per_ms = max(rates)
    return gpu.cycles_per_ms


def sleep_ms_for(host: Sequence[float]) -> float:
    """Milliseconds of GPU busy-wait that cover a call whose recent host times are ``host``."""
    recent = max(host[-HOST_WINDOW:]) if host else 0.0
    return min(SLEEP_CAP_MS, SLEEP_FACTOR * recent + SLEEP_MARGIN_MS)


def gpu_samples(call: Callable[[], object], n: int, gpu: Gpu, host: list[float]) -> list[float]:
    """``n`` GPU times (ms) of ``call()``, each behind a busy-wait that hides the host.

    ``host`` is the caller's record of this call's host times (ms, wall time of ``call()``
    without synchronisation): read for the busy-wait's length, appended to by every sample.
    When it is empty, two untimed calls measure it first.  A late sample (host enqueue longer
    than the busy-wait) is taken once more; see the module docstring.
    """
    if gpu.cycles_per_ms is None:
        calibrate(gpu)
    if not host:
        first = []
        for _ in range(2):
            gpu.sync()
            t0 = now()
            call()
            first.append((now() - t0) * 1e3)
            gpu.sync()
        host.append(min(first))
    out = []
    for _ in range(n):
        for attempt in range(2):
            sleep_ms = sleep_ms_for(host)
            gpu.sync()
            start, end = gpu.event(), gpu.event()
            t0 = now()
            gpu.sleep(int(sleep_ms * gpu.cycles_per_ms))
            gpu.flush()
            gpu.record(start)
            t1 = now()
            call()
            t2 = now()
            gpu.record(end)
            t3 = now()
            host.append((t2 - t1) * 1e3)
            late = (t3 - t0) * 1e3 > sleep_ms
            if not late or sleep_ms >= SLEEP_CAP_MS:   # a longer wait would not be allowed
                break
        gpu.late += late
        gpu.sync()
        out.append(start.elapsed_time(end))
    return out


def sample(step: PoolStep, fn: Callable, n: int) -> list[float]:
    """``n`` timings (milliseconds) of ``step(fn, fresh inputs)``: GPU time on CUDA (see the
    module docstring), wall time on the CPU."""
    if step.device.type == "cuda":
        return gpu_samples(lambda: step(fn, step.next_inputs()), n, gpu_for(step.device),
                           step.host_times(fn))
    out = []
    for _ in range(n):
        inputs = step.next_inputs()
        t0 = now()
        step(fn, inputs)
        out.append((now() - t0) * 1e3)
    return out


def host_ms(step: PoolStep, fn: Callable) -> Optional[float]:
    """Median host time (ms per call, not synchronised) of ``fn``'s CUDA samples on ``step``;
    None before any (and on the CPU, where the sample is the wall time itself)."""
    times = step.host_times(fn) if step.device.type == "cuda" else []
    return median(times) if times else None


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
