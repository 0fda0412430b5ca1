"""Where a user's time goes: GPU time, host time and eager wall time of samu_tune's calls.

    python -m benchmarks.bench_host --out DIR [--quick] [--only scan,layer,...]
    TRITON_INTERPRET=1 python -m benchmarks.bench_host --smoke --out DIR   # no GPU: code paths only

Each case is a zero-argument call (one scan call, one layer call, one decode step, one training
step of a small model).  After a warm-up (the first call's seconds are kept: compilation),
the script measures three things per case:

1. **GPU time** (``gpu_ms``): the kernels' time alone.  For the scan, the layer and the decode
   step, CUDA events around one call, each sample queued behind a GPU busy-wait
   (``torch.cuda._sleep``, calibrated in cycles per ms) longer than the host's enqueue of the
   call, so the GPU never waits for the host between the events: the tuner's clock,
   ``samu_tune.timing.gpu_samples``, with its L2 flush switched off (L2 is NOT flushed here:
   consecutive calls read the same inputs, warm in L2 where they fit).  Median over samples.
   For a model training step, CUDA events around the K steps of the host measurement below
   (all K steps queued behind one busy-wait, so they run back to back on the GPU), divided by
   K; valid when that window is covered (``host_covered``).
2. **Host time per call** (``host_ms``): one long ``torch.cuda._sleep`` (twice the eager wall
   of the N calls, plus 1 ms), then N calls back to back; ``time.perf_counter()`` around the N
   calls, stopped before any synchronisation, divided by N.  The sleep is long enough when the
   event recorded right after it has not completed when the clock stops
   (``event.query()`` is False: ``host_covered``).  The eager wall bounds the host time, so a
   sleep of twice that is not covered only when the host was blocked (CUDA's launch queue is
   full: a model step launches hundreds of kernels; or a call synchronises): N is then halved
   (with 1.5x more slack per try, at most 6 tries) and the last try is reported
   (``host_n`` calls; ``host_covered`` False when none was covered).
3. **Eager wall per call** (``wall_ms``): N calls back to back, then one
   ``torch.cuda.synchronize()``; wall time / N, median of a few rounds.  What an eager loop
   pays: max(host, GPU) per call, roughly.

N = 50 scan calls (20 at >= 16M elements), 30 layer calls (20 at >= 8M), 200 decode steps,
K = 20 model steps (10 at >= 32k tokens); 3 rounds of the wall, 15 GPU samples.

Cases (bf16 unless stated):

- scan: ``samu_tune.scan(eta, delta, nu_log, theta_log, br, bi)`` on the grid of
  ``benchmarks/bench_scan.py`` plus one off-grid shape, forward (under ``no_grad``) and
  forward+backward (``torch.autograd.backward((out.real, out.imag), (g_r, g_i))`` with
  precomputed gradients; each call first sets the leaves' ``.grad`` to None, as
  ``zero_grad(set_to_none=True)`` does, so no accumulation kernels run).  Beside each,
  ``accelerated_scan.complex.scan(forget, x)`` on the materialised complex64 transition and
  input ([B, M, L], built outside the timed call), measured the same way; recorded as missing
  when ``accelerated_scan`` does not import.  ``samu_tune.explain`` gives the dispatch choice.
- layer: ``samu_tune.SAMU(modes=M)`` (strategy auto), x [B, L, 2M], forward (no_grad) and
  forward+backward (x and every parameter, a precomputed gradient of y).
- decode: ``layer.step(x_t, state, out=y_t, state_out=state)`` under no_grad, M = 1024.
- floor (``benchmarks/host_floor.py``): the host time of the pieces a call is made of (an
  empty Python call, an allocation, one ATen launch, a 34-argument Triton launch through
  ``kernel[grid]`` and directly) and of four library calls with and without their Triton
  launches (stubbed): where the host time goes.
- model: 4 residual blocks ``x + Linear(2M, 2M)(SAMU(M)(x)[0])``, fp32 parameters, bf16
  autocast, AdamW; a step = forward, ``y.float().pow(2).mean()``, backward, ``opt.step()``,
  ``zero_grad(set_to_none=True)``.  Eager, ``torch.compile`` (default, reduce-overhead,
  fullgraph=True), and the same model with ``Linear(2M, 2M) + relu`` in place of SAMU (eager
  and compiled).  ``torch._dynamo.explain`` counts the graph breaks; each compiled variant
  also records dynamo's counters over its own steps (graphs compiled, graph breaks, CUDA
  graphs inductor skipped); a variant that fails to compile records the error's first line.

Every case is guarded: a failure records ``{"error": ...}`` and the run goes on.  Writes
``bench_host.json`` (every number, device, versions, choices) and ``bench_host.md`` (tables,
also printed) under --out, the JSON after every case.

``--smoke`` runs on the CPU (the Triton interpreter) at tiny shapes with plain wall clocks in
place of the CUDA measurements (no busy-wait, no events; ``timing`` says ``cpu-wall``),
compiles with ``backend="aot_eager"`` and skips reduce-overhead and accelerated-scan: it
exercises the code paths only, its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

if "--smoke" in sys.argv:  # before triton is imported: Triton kernels on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from torch import nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import samu_tune  # noqa: E402
from samu_tune import timing  # noqa: E402
from samu_tune.device import device_info  # noqa: E402
from samu_tune.settings import settings  # noqa: E402
from samu_tune import DecodeProblem, ScanProblem  # noqa: E402
try:
    from samu_tune.ops.layer.problem import LayerProblem
except ImportError:  # the samu_tune of a baseline run, before the ops had folders
    from samu_tune.problem import LayerProblem

from benchmarks.common import GRID, accel_operands, add_out, error_text, write_json  # noqa: E402

OFF_GRID = [(3, 5000, 300)]
LAYER_SHAPES = [(4, 4096, 512), (1, 16384, 256), (8, 1024, 256)]
DECODE_BATCHES, DECODE_M = (1, 16, 64), 1024
MODEL_SHAPES = [(4, 4096, 512), (8, 1024, 256), (2, 16384, 256)]
MODEL_DEPTH = 4
PARTS = ("scan", "layer", "decode", "model", "floor")

# model variants: (name, block kind, torch.compile kwargs or None for eager)
VARIANTS = [("eager", "samu", None),
            ("compiled", "samu", {}),
            ("reduce-overhead", "samu", {"mode": "reduce-overhead"}),
            ("reduce-overhead fwd+bwd", "samu", {"mode": "reduce-overhead"}),
            ("fullgraph", "samu", {"fullgraph": True}),
            ("relu eager", "relu", None),
            ("relu compiled", "relu", {}),
            ("relu reduce-overhead", "relu", {"mode": "reduce-overhead"})]

SLEEP_CAP_MS = 4000.0   # longest busy-wait of the host measurement
HOST_TRIES = 6          # N, N/2, ... : tries of the host measurement


class Plan:
    """Shapes and repetition counts of one run (default, --quick or --smoke)."""

    def __init__(self, quick: bool, smoke: bool):
        self.smoke = smoke
        self.scan_shapes = GRID + OFF_GRID
        self.layer_shapes = LAYER_SHAPES
        self.decode_batches, self.decode_m = DECODE_BATCHES, DECODE_M
        self.model_shapes = MODEL_SHAPES
        self.rounds, self.gpu_n, self.warmup = 3, 15, 3
        self.model_warmup = 5      # reduce-overhead records its CUDA graphs in the first steps
        if quick:
            self.scan_shapes = [(4, 4096, 512), (32, 512, 256), (3, 5000, 300)]
            self.layer_shapes = [(4, 4096, 512)]
            self.decode_batches = (1, 64)
            self.model_shapes = [(8, 1024, 256)]
        if smoke:
            self.scan_shapes = [(1, 32, 16)]
            self.layer_shapes = [(1, 32, 16)]
            self.decode_batches, self.decode_m = (1,), 16
            self.model_shapes = [(1, 32, 16)]
            self.rounds, self.gpu_n, self.warmup, self.model_warmup = 1, 2, 1, 1

    def scan_n(self, shape) -> int:
        if self.smoke:
            return 2
        return 20 if math.prod(shape) >= (1 << 24) else 50

    def layer_n(self, shape) -> int:
        return 2 if self.smoke else (20 if math.prod(shape) >= (1 << 23) else 30)

    def decode_n(self) -> int:
        return 2 if self.smoke else 200

    def model_k(self, shape) -> int:
        return 2 if self.smoke else (10 if shape[0] * shape[1] >= 32768 else 20)


# ---------------------------------------------------------------- clocks ----------------------

class NoFlushGpu(timing.Gpu):
    """The tuner's sample operations without the L2 flush (this benchmark keeps L2 warm)."""

    def flush(self) -> None:
        pass


class Clock:
    """Eager wall per call, on any device: N calls, then one synchronisation."""

    kind = "?"

    def sync(self) -> None:
        pass

    def wall(self, call: Callable, n: int, rounds: int) -> dict:
        per_call = []
        for _ in range(rounds):
            self.sync()
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            self.sync()
            per_call.append((time.perf_counter() - t0) * 1e3 / n)
        return {"wall_ms": statistics.median(per_call), "wall_rounds_ms": per_call, "n": n}


class CudaClock(Clock):
    """The three measurements on a CUDA device (see the module docstring)."""

    kind = "cuda-events"

    def __init__(self, device: torch.device):
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.gpu = NoFlushGpu(device)
        timing.calibrate(self.gpu)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def behind_sleep(self, call: Callable, n: int, estimate_ms: float) -> dict:
        """Host ms per call of ``n`` calls queued behind one busy-wait, and the GPU ms per call
        of the window they then run in (events right after the sleep and after the calls)."""
        def sleep_for(n: int) -> float:      # more slack with every try
            return min(SLEEP_CAP_MS, (2.0 * n * estimate_ms + 1.0) * 1.5 ** len(tries))

        tries: list[dict] = []
        sleep_ms = sleep_for(n)
        while True:
            self.sync()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(self.device):
                torch.cuda._sleep(int(sleep_ms * self.gpu.cycles_per_ms))
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            t1 = time.perf_counter()
            covered = not start.query()      # the GPU is still in the sleep
            end.record()
            self.sync()
            host = (t1 - t0) * 1e3
            tries.append({"n": n, "sleep_ms": round(sleep_ms, 3), "host_ms": host / n,
                          "window_gpu_ms": start.elapsed_time(end) / n, "covered": covered})
            if covered or n == 1 or len(tries) == HOST_TRIES:
                break
            # the sleep was twice the eager wall of the n calls, which bounds their host time:
            # the host was blocked (a full launch queue, or a synchronising call), so fewer calls
            n = max(1, n // 2)
            sleep_ms = sleep_for(n)
        last = tries[-1]
        return {"host_ms": last["host_ms"], "host_covered": last["covered"],
                "host_n": last["n"], "host_sleep_ms": last["sleep_ms"],
                "window_gpu_ms": last["window_gpu_ms"],
                "host_tries": tries if len(tries) > 1 else None}

    def gpu_time(self, call: Callable, n: int) -> dict:
        host: list[float] = []
        late = self.gpu.late
        samples = timing.gpu_samples(call, n, self.gpu, host)
        return {"gpu_ms": statistics.median(samples), "gpu_samples": len(samples),
                "gpu_late": self.gpu.late - late,
                "gpu_sample_host_ms": statistics.median(host)}


class CpuClock(Clock):
    """--smoke: plain wall clocks in place of the CUDA measurements (code paths only)."""

    kind = "cpu-wall"

    def behind_sleep(self, call: Callable, n: int, estimate_ms: float) -> dict:
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        host = (time.perf_counter() - t0) * 1e3 / n
        return {"host_ms": host, "host_covered": None, "host_n": n, "host_sleep_ms": None,
                "window_gpu_ms": host, "host_tries": None}

    def gpu_time(self, call: Callable, n: int) -> dict:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e3)
        return {"gpu_ms": statistics.median(samples), "gpu_samples": n, "gpu_late": 0,
                "gpu_sample_host_ms": None}


def measure(clock, call: Callable, n: int, *, rounds: int, gpu_n: int, warmup: int,
            window_gpu: bool = False) -> dict:
    """The three measurements of ``call`` (see the module docstring).  ``window_gpu``: GPU
    time from the host measurement's window (model steps) instead of per-call samples."""
    t0 = time.perf_counter()
    call()
    clock.sync()
    res = {"first_call_s": time.perf_counter() - t0}
    for _ in range(warmup - 1):
        call()
    clock.sync()
    res.update(clock.wall(call, n, rounds))
    res.update(clock.behind_sleep(call, n, res["wall_ms"]))
    if window_gpu:
        res["gpu_ms"] = res["window_gpu_ms"]
        res["gpu_method"] = "events around the host window's steps"
    else:
        res.update(clock.gpu_time(call, gpu_n))
        res["gpu_method"] = "events per call behind a busy-wait (median)"
    return res


def guarded(what: str, fn: Callable[[], dict]) -> dict:
    """``fn()``, or ``{"error": first line, "where": innermost frame}`` when it raises."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every failure is a result here
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        err = {"error": error_text(exc, 400, first_line=True),
               "where": f"{frame.filename}:{frame.lineno} {frame.name}"}
        print(f"  {what}: {err['error']}", flush=True)
        return err


# ---------------------------------------------------------------- scan ------------------------

def scan_inputs(shape, device: torch.device, seed: int = 0) -> dict:
    """eta, delta [B, L] fp32 (randn * 0.1: sane decays), nu_log, theta_log [M] fp32, br, bi
    [B, L, M] bf16."""
    B, L, M = shape
    g = torch.Generator(device=device).manual_seed(seed)

    def uniform(lo, hi, n):
        return torch.rand(n, generator=g, device=device) * (hi - lo) + lo

    return {"eta": torch.randn(B, L, generator=g, device=device) * 0.1,
            "delta": torch.randn(B, L, generator=g, device=device) * 0.1,
            "nu_log": uniform(0.001, 0.1, M).log(),
            "theta_log": uniform(0.01, 3.0, M).log(),
            "br": torch.randn(B, L, M, generator=g, device=device).to(torch.bfloat16),
            "bi": torch.randn(B, L, M, generator=g, device=device).to(torch.bfloat16)}


ARGS = ("eta", "delta", "nu_log", "theta_log", "br", "bi")


def scan_call(inputs: dict, train: bool) -> Callable:
    args = [inputs[k] for k in ARGS]
    if not train:
        def forward():
            with torch.no_grad():
                return samu_tune.scan(*args)
        return forward
    leaves = [a.detach().requires_grad_(True) for a in args]
    g_r, g_i = torch.randn_like(inputs["br"]), torch.randn_like(inputs["bi"])

    def forward_backward():
        for t in leaves:
            t.grad = None
        out = samu_tune.scan(*leaves)
        torch.autograd.backward((out.real, out.imag), (g_r, g_i))
    return forward_backward


def accel_call(accel_scan, inputs: dict, train: bool) -> Callable:
    """accelerated_scan.complex on the materialised transition and input (complex64, [B, M, L],
    prepared here, outside the timed call)."""
    forget, x = accel_operands(*(inputs[k] for k in ARGS))
    if not train:
        def forward():
            with torch.no_grad():
                return accel_scan(forget, x)
        return forward
    forget.requires_grad_(True)
    x.requires_grad_(True)
    grad = torch.randn_like(x)

    def forward_backward():
        forget.grad = x.grad = None
        torch.autograd.backward(accel_scan(forget, x), grad)
    return forward_backward


def load_accel():
    """(accelerated_scan.complex.scan or None, why not)."""
    try:
        from accelerated_scan.complex import scan as accel_scan
        return accel_scan, None
    except Exception as exc:  # noqa: BLE001
        return None, error_text(exc, 400, first_line=True)


def choice(problem) -> dict:
    """What ``samu_tune`` dispatch runs for ``problem`` (``samu_tune.explain``; never tunes)."""
    ex = samu_tune.explain(problem)
    return {"strategy": ex.strategy, "config": ex.config, "source": ex.source,
            "source_key": ex.source_key, "error": ex.error}


def scan_choice(shape, device: torch.device, train: bool) -> dict:
    B, L, M = shape
    return choice(ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device=device.type,
                              backward=train))


def run_scan(plan: Plan, clock, device: torch.device, out: dict, save: Callable) -> None:
    accel_scan, accel_missing = (None, "skipped under --smoke") if plan.smoke else load_accel()
    for shape in plan.scan_shapes:
        inputs = guarded(f"scan inputs {shape}", lambda: scan_inputs(shape, device))
        for mode in ("forward", "train"):
            train = mode == "train"
            row = {"shape": list(shape), "mode": mode}
            row["choice"] = guarded("explain", lambda: scan_choice(shape, device, train))
            n = plan.scan_n(shape)
            kw = dict(rounds=plan.rounds, gpu_n=plan.gpu_n, warmup=plan.warmup)
            if "error" in inputs:
                row["samu_tune"] = inputs
            else:
                row["samu_tune"] = guarded(f"scan {shape} {mode}", lambda: measure(
                    clock, scan_call(inputs, train), n, **kw))
            if accel_scan is None:
                row["accelerated_scan"] = {"missing": accel_missing}
            elif "error" not in inputs:
                row["accelerated_scan"] = guarded(f"accel {shape} {mode}", lambda: measure(
                    clock, accel_call(accel_scan, inputs, train), n, **kw))
            out["scan"].append(row)
            report("scan", f"{shape} {mode}", row["samu_tune"], row.get("accelerated_scan"))
            save()
        del inputs


# ---------------------------------------------------------------- layer, decode ---------------

def layer_call(shape, device: torch.device, train: bool) -> Callable:
    B, L, M = shape
    torch.manual_seed(0)
    layer = samu_tune.SAMU(modes=M).to(device)
    x = torch.randn(B, L, 2 * M, device=device, dtype=torch.bfloat16)
    if not train:
        def forward():
            with torch.no_grad():
                return layer(x)
        return forward
    x.requires_grad_(True)
    leaves = [x, *layer.parameters()]
    g = torch.randn(B, L, 2 * M, device=device, dtype=torch.bfloat16)

    def forward_backward():
        for t in leaves:
            t.grad = None
        y, _ = layer(x)
        torch.autograd.backward(y, g)
    return forward_backward


def decode_call(B: int, M: int, device: torch.device) -> Callable:
    torch.manual_seed(0)
    layer = samu_tune.SAMU(modes=M).to(device)
    x_t = torch.randn(B, 2 * M, device=device, dtype=torch.bfloat16)
    y_t = torch.empty(B, 2 * M, device=device, dtype=torch.bfloat16)
    state = (torch.zeros(B, M, device=device), torch.zeros(B, M, device=device))

    def step():
        with torch.no_grad():
            layer.step(x_t, state, out=y_t, state_out=state)
    return step


def run_layer(plan: Plan, clock, device: torch.device, out: dict, save: Callable) -> None:
    for shape in plan.layer_shapes:
        for mode in ("forward", "train"):
            B, L, M = shape
            row = {"shape": list(shape), "mode": mode, "choice": guarded("explain", lambda: choice(
                LayerProblem(B=B, L=L, M=M, dtype="bfloat16", device=device.type,
                             backward=mode == "train")))}
            row.update(guarded(f"layer {shape} {mode}", lambda: measure(
                clock, layer_call(shape, device, mode == "train"), plan.layer_n(shape),
                rounds=plan.rounds, gpu_n=plan.gpu_n, warmup=plan.warmup)))
            out["layer"].append(row)
            report("layer", f"{shape} {mode}", row)
            save()


def run_decode(plan: Plan, clock, device: torch.device, out: dict, save: Callable) -> None:
    for B in plan.decode_batches:
        row = {"B": B, "M": plan.decode_m, "choice": guarded("explain", lambda: choice(
            DecodeProblem(B=B, M=plan.decode_m, dtype="bfloat16", device=device.type)))}
        row.update(guarded(f"decode B={B}", lambda: measure(
            clock, decode_call(B, plan.decode_m, device), plan.decode_n(),
            rounds=plan.rounds, gpu_n=plan.gpu_n, warmup=plan.warmup)))
        out["decode"].append(row)
        report("decode", f"B={B} M={plan.decode_m}", row)
        save()


# ---------------------------------------------------------------- model -----------------------

class SAMUBlock(nn.Module):
    """``x + Linear(2M, 2M)(SAMU(M)(x)[0])``."""

    def __init__(self, M: int):
        super().__init__()
        self.samu = samu_tune.SAMU(modes=M)
        self.proj = nn.Linear(2 * M, 2 * M)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.samu(x)[0])


class ReluBlock(nn.Module):
    """The same block with ``Linear(2M, 2M) + relu`` in place of SAMU."""

    def __init__(self, M: int):
        super().__init__()
        self.mix = nn.Linear(2 * M, 2 * M)
        self.proj = nn.Linear(2 * M, 2 * M)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.relu(self.mix(x)))


def make_model(kind: str, M: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    block = SAMUBlock if kind == "samu" else ReluBlock
    return nn.Sequential(*[block(M) for _ in range(MODEL_DEPTH)]).to(device)


def compile_kwargs(kwargs: dict, smoke: bool) -> dict:
    return {**kwargs, "backend": "aot_eager"} if smoke else kwargs


def train_step(kind: str, kwargs: Optional[dict], shape, device: torch.device,
               smoke: bool, optimizer: bool = True) -> Callable:
    """One training step of the model (compiled with ``kwargs`` unless None); without
    ``optimizer``, forward and backward only.  AdamW is the fused one on CUDA (one launch
    for all parameters, the same for both models)."""
    B, L, M = shape
    model = make_model(kind, M, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            **({"fused": True} if device.type == "cuda" else {}))
    run = model if kwargs is None else torch.compile(model, **compile_kwargs(kwargs, smoke))
    x = torch.randn(B, L, 2 * M, device=device, dtype=torch.bfloat16)
    graphs = kwargs is not None and kwargs.get("mode") == "reduce-overhead"

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = run(x)
            loss = y.float().pow(2).mean()
        loss.backward()
        if optimizer:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def graph_breaks(kind: str, shape, device: torch.device) -> dict:
    """``torch._dynamo.explain`` of the model's forward: graphs, breaks, their reasons."""
    B, L, M = shape
    model = make_model(kind, M, device)
    x = torch.randn(B, L, 2 * M, device=device, dtype=torch.bfloat16)
    torch._dynamo.reset()
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            ex = torch._dynamo.explain(model)(x)
    finally:
        torch._dynamo.reset()
    reasons = []
    for r in ex.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        where = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
        text = (str(r.reason).strip().splitlines() or [""])[0][:200] + where
        if text not in reasons:
            reasons.append(text)
    return {"graph_count": ex.graph_count, "graph_break_count": ex.graph_break_count,
            "break_reasons": reasons}


def run_model(plan: Plan, clock, device: torch.device, out: dict, save: Callable) -> None:
    for name in ("cache_size_limit", "recompile_limit"):   # one model, several shapes
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    for shape in plan.model_shapes:
        for kind in ("samu", "relu"):
            ex = guarded(f"explain {kind} {shape}", lambda: graph_breaks(kind, shape, device))
            out["model_explain"].append({"shape": list(shape), "kind": kind, **ex})
            save()
        for name, kind, kwargs in VARIANTS:
            row = {"shape": list(shape), "variant": name, "kind": kind,
                   "compile": None if kwargs is None else compile_kwargs(kwargs, plan.smoke)}
            if plan.smoke and (kwargs or {}).get("mode") == "reduce-overhead":
                row["skipped"] = "CUDA graphs: not under --smoke"
            else:
                torch._dynamo.reset()
                counters.clear()
                row.update(guarded(f"model {shape} {name}", lambda: measure(
                    clock, train_step(kind, kwargs, shape, device, plan.smoke,
                                      optimizer="fwd+bwd" not in name),
                    plan.model_k(shape), rounds=plan.rounds, gpu_n=0,
                    warmup=plan.model_warmup if kwargs is not None else plan.warmup,
                    window_gpu=True)))
                if kwargs is not None:   # what dynamo and inductor did in this variant's steps
                    row["dynamo"] = {
                        "graphs_compiled": counters["stats"].get("unique_graphs", 0),
                        "graph_breaks": sum(counters["graph_break"].values()),
                        "cudagraph_skips": counters["inductor"].get("cudagraph_skips", 0)}
                torch._dynamo.reset()
            if name == "fullgraph":
                row["fullgraph_compiles"] = "error" not in row and "skipped" not in row
            out["model"].append(row)
            report("model", f"{shape} {name}", row)
            save()


# ---------------------------------------------------------------- report ----------------------

def report(part: str, label: str, *results) -> None:
    cells = []
    for r in results:
        if not r:
            continue
        if "error" in r:
            cells.append(f"error: {r['error'][:120]}")
        elif "gpu_ms" in r:
            cover = "" if r.get("host_covered") in (True, None) else " (host window NOT covered)"
            cells.append(f"gpu {r['gpu_ms']:.4f} host {r['host_ms']:.4f} "
                         f"wall {r['wall_ms']:.4f} ms{cover}")
        else:
            cells.append("; ".join(f"{k}: {r[k]}" for k in ("missing", "skipped") if k in r))
    print(f"[{time.strftime('%H:%M:%S')}] {part} {label}: " + " | ".join(cells), flush=True)


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, float):
        return f"{v:.1f}" if v >= 100 else f"{v:.3f}" if v >= 0.1 else f"{v:.4f}"
    return str(v)


def get(r: Optional[dict], key: str):
    return None if not r or "error" in r else r.get(key)


def ratio(a, b):
    return a / b if a is not None and b else None


def choice_text(row: dict) -> str:
    ch = row.get("choice") or {}
    text = ch.get("strategy") or ch.get("error") or "—"
    return text + (f" ({ch['source']})" if ch.get("source") else "")


def markdown(data: dict) -> str:
    meta = data["meta"]
    lines = [f"# bench_host: GPU time, host time and eager wall ({meta['device']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, samu_tune "
             f"{meta['samu_tune']}, accelerated-scan {meta['accelerated_scan']}; clock "
             f"{meta['timing']}.", "",
             "GPU = kernels only (events behind a busy-wait; L2 not flushed), host = host "
             "time per call (N calls queued behind a busy-wait), wall = N eager calls then one "
             "synchronize, per call; bound = the larger of GPU and host.  ms.  A host time "
             "marked * was not covered by its busy-wait (it includes waits on the GPU).", ""]
    if meta["timing"] == "cpu-wall":
        lines += ["**--smoke: every column is CPU wall time under the Triton interpreter; the "
                  "numbers mean nothing.**", ""]
    errors = []

    def cell(r, key):
        if r and "error" in r:
            errors.append(r["error"])
            return "error"
        star = "*" if key == "host_ms" and r and r.get("host_covered") is False else ""
        return fmt(get(r, key)) + star

    def bound(r):
        g, h = get(r, "gpu_ms"), get(r, "host_ms")
        return "—" if g is None or h is None else ("host" if h > g else "GPU")

    def times(r):
        return (f"{cell(r, 'gpu_ms')} | {cell(r, 'host_ms')} | {cell(r, 'wall_ms')} | "
                f"{bound(r)}")

    for mode, title in (("forward", "Scan forward"), ("train", "Scan forward + backward")):
        rows = [r for r in data["scan"] if r["mode"] == mode]
        if not rows:
            continue
        lines += [f"## {title}", "",
                  "| shape (B, L, M) | choice | GPU ms | host ms/call | wall ms/call | bound | "
                  "accel GPU ms | accel host ms | accel wall ms | accel wall / our wall |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            ours, acc = row.get("samu_tune"), row.get("accelerated_scan")
            if acc and "missing" in acc:
                theirs = "missing | missing | missing | —"
            else:
                vs = ratio(get(acc, "wall_ms"), get(ours, "wall_ms"))
                theirs = (f"{cell(acc, 'gpu_ms')} | {cell(acc, 'host_ms')} | "
                          f"{cell(acc, 'wall_ms')} | {fmt(vs)}")
            lines.append(f"| {tuple(row['shape'])} | {choice_text(row)} | {times(ours)} | "
                         f"{theirs} |")
        lines.append("")

    if data["layer"]:
        lines += ["## Layer (SAMU, strategy auto)", "",
                  "| shape (B, L, M) | mode | choice | GPU ms | host ms/call | wall ms/call | "
                  "bound |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {tuple(r['shape'])} | {r['mode']} | {choice_text(r)} | {times(r)} |"
                  for r in data["layer"]]
        lines.append("")
    if data["decode"]:
        lines += ["## Decode step (in place, no_grad)", "",
                  "| B | M | choice | GPU ms | host ms/call | wall ms/call | bound |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['B']} | {r['M']} | {choice_text(r)} | {times(r)} |"
                  for r in data["decode"]]
        lines.append("")

    if data["model"] or data["model_explain"]:
        lines += [f"## Model: {MODEL_DEPTH} residual blocks, bf16 autocast, AdamW, one "
                  "training step", "",
                  "GPU = events around the host window's steps / steps (valid where host has "
                  "no *).  wall / Linear+relu: eager against the eager Linear+relu model, "
                  "compiled variants against the Linear+relu model compiled the same way; "
                  "fwd+bwd: no optimizer step (AdamW fused).  wall / GPU is the overhead "
                  "factor.  Graph breaks: "
                  "torch._dynamo.explain of the forward.", "",
                  "| shape (B, L, M) | variant | wall ms/step | GPU ms/step | host ms/step | "
                  "wall / GPU | wall / Linear+relu | graph breaks | note |",
                  "|---|---|---|---|---|---|---|---|---|"]
    explains = {(tuple(e["shape"]), e["kind"]): e for e in data["model_explain"]}
    by_variant = {(tuple(r["shape"]), r["variant"]): r for r in data["model"]}
    for r in data["model"]:
        shape = tuple(r["shape"])
        mode = (r["compile"] or {}).get("mode")
        base = by_variant.get((shape, "relu eager" if r["compile"] is None else
                               "relu reduce-overhead" if mode == "reduce-overhead" else
                               "relu compiled"))
        ex = explains.get((shape, r["kind"]), {})
        breaks = fmt(ex.get("graph_break_count")) if r["compile"] is not None else "—"
        note = r.get("skipped", "")
        if r["variant"] == "fullgraph":
            note = "compiles" if r.get("fullgraph_compiles") else \
                f"does not compile: {r.get('error', note)}"[:160]
        elif "error" in r:
            note = r["error"][:160]
        dyn = r.get("dynamo") or {}
        if dyn.get("cudagraph_skips"):
            note += f" inductor skipped CUDA graphs {dyn['cudagraph_skips']}x"
        if dyn:
            note += f" ({dyn['graphs_compiled']} graphs compiled)"
        host = "—" if "error" in r else cell(r, "host_ms")
        vs_relu = ratio(get(r, "wall_ms"), get(base, "wall_ms"))
        lines.append(f"| {shape} | {r['variant']} | {fmt(get(r, 'wall_ms'))} | "
                     f"{fmt(get(r, 'gpu_ms'))} | {host} | "
                     f"{fmt(ratio(get(r, 'wall_ms'), get(r, 'gpu_ms')))} | {fmt(vs_relu)} | "
                     f"{breaks} | "
                     f"{note.replace('|', '/')} |")
    reasons = [(e["shape"], e["kind"], e.get("break_reasons") or [e.get("error")])
               for e in data["model_explain"] if e.get("break_reasons") or e.get("error")]
    if reasons:
        lines += ["", "Graph break reasons (first line of each distinct reason):", ""]
        lines += [f"- {tuple(shape)} {kind}: " + "; ".join(str(x) for x in rs)
                  for shape, kind, rs in reasons]
    from benchmarks.host_floor import floor_markdown
    from benchmarks.host_sections import sections_markdown
    lines += floor_markdown(data.get("floor", []), fmt)
    lines += sections_markdown(data.get("floor_sections", []), fmt)
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in dict.fromkeys(errors)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main ------------------------

def meta(device: torch.device, clock, args) -> dict:
    try:
        accel = importlib.metadata.version("accelerated-scan")
    except importlib.metadata.PackageNotFoundError:
        accel = "not installed"
    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else
        f"cpu ({'Triton interpreter' if os.environ.get('TRITON_INTERPRET') == '1' else 'torch'})",
        "signature": device_info(device).signature(),
        "torch": torch.__version__, "triton": triton.__version__,
        "samu_tune": samu_tune.__version__, "accelerated_scan": accel,
        "python": platform.python_version(), "argv": sys.argv[1:],
        "samu_tune_mode": settings().mode, "timing": clock.kind, "l2_flushed": False,
        "sleep_cycles_per_ms": clock.gpu.cycles_per_ms if cuda else None,
        "method": __doc__.split("Cases (")[0].strip(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(parser, default=None)
    parser.add_argument("--quick", action="store_true", help="fewer shapes: a fast check")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, Triton interpreter, tiny shapes, wall clocks: code paths only")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts of {','.join(PARTS)}")
    args = parser.parse_args()
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--only: unknown part(s) {unknown}; choose from {list(PARTS)}")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --smoke (and TRITON_INTERPRET=1) on the CPU")

    device = torch.device("cpu") if args.smoke else torch.device("cuda")
    clock = CpuClock() if args.smoke else CudaClock(device)
    plan = Plan(args.quick, args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = {"meta": meta(device, clock, args), "scan": [], "layer": [], "decode": [],
            "model": [], "model_explain": []}

    from benchmarks.host_floor import launch_counts, run_floor

    def save() -> None:
        data["meta"]["elapsed_s"] = round(time.perf_counter() - started, 1)
        # per kernel, the run's launches through the direct path and through kernel[grid]
        data["meta"]["launches"] = launch_counts()
        write_json(args.out / "bench_host.json", data)

    print(f"bench_host on {data['meta']['device']} ({clock.kind}), parts {parts}", flush=True)
    runners = {"scan": run_scan, "layer": run_layer, "decode": run_decode, "model": run_model,
               "floor": run_floor}
    for part in PARTS:
        if part in parts:
            result = guarded(part, lambda: runners[part](plan, clock, device, data, save) or {})
            if "error" in result:
                data.setdefault("part_errors", {})[part] = result
    save()
    md = markdown(data)
    (args.out / "bench_host.md").write_text(md)
    print(md)
    for row in data["meta"]["launches"]:
        print(f"launches of {row['kernel']}: {row['direct']} direct, {row['normal']} through "
              f"kernel[grid]{'' if row['reason'] is None else ' (' + row['reason'] + ')'}")
    print(f"wrote {args.out / 'bench_host.json'} and bench_host.md in "
          f"{data['meta']['elapsed_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
