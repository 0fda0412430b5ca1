"""Where a call's host time goes: the floor part of ``benchmarks/bench_host.py``.

Host time per call (behind a GPU busy-wait, as bench_host measures it) of the pieces a
samu_tune call is made of, on the machine that runs the GPU:

- the floors: an empty Python call; one ``torch.empty`` of [4, 4096, 512] bf16; a
  ``torch.zeros`` of 1024 int32 (an allocation and a fill launch: a look-back head); an
  ``as_strided`` view; a 16-element torch add (one ATen kernel launch, what a C++ operator's
  launch costs); an autograd Function of the scan's arity (10 inputs, 4 outputs, 10 saved,
  nothing computed) forward and forward+backward: autograd's own cost, device thread
  included; the same forward+backward with autograd's engine on the calling thread
  (``torch.autograd.set_multithreading_enabled(False)``: no hand-off to the device's
  autograd thread and back), and four such Functions chained with one backward (the engine's
  fixed cost shared, as in a model's step); a Triton kernel of 34 arguments (28 tensors, 6 ints: the look-back kernel's
  count) launched through ``kernel[grid](...)`` and through samu_tune's direct launch
  (:mod:`samu_tune.launcher`);
- the scan forward and forward+backward, the fused layer forward+backward and the decode step,
  each twice (the scan's forward+backward a third time, the engine on the calling thread):
  as is, and with every Triton launch stubbed out (the Python, the torch
  allocations and fills and the autograd bookkeeping remain; the outputs are garbage).  The
  difference is what the launches themselves cost the host.  Each also counts the ATen
  operators one stubbed call dispatches (``ops``: allocations, views, fills, autograd's
  detaches), so that ops x their floor accounts for a share of the stubbed time;
- the scan calls once more, as is and stubbed, their host time by function
  (:mod:`benchmarks.host_sections`).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import triton
import triton.language as tl

PROBE_SHAPE = (4, 4096, 512)
SMOKE_SHAPE = (1, 32, 16)
DECODE_B = 1


@triton.jit
def _probe(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17,
           t18, t19, t20, t21, t22, t23, t24, t25, t26, t27, i0, i1, i2, i3, i4, i5,
           X: tl.constexpr):
    tl.store(t0 + tl.program_id(0), i0 + X)


@contextlib.contextmanager
def launches_stubbed():
    """Every Triton launch a no-op inside the block: samu_tune's direct launches and
    ``kernel[grid](...)``."""
    from triton.runtime.jit import JITFunction
    from samu_tune import launcher, scratch

    def noop(*args, **kwargs):
        return None

    saved = [(JITFunction, "__getitem__", JITFunction.__getitem__)]
    JITFunction.__getitem__ = lambda self, grid: noop
    fast = getattr(launcher, "FastKernel", None)
    if fast is not None:
        saved.append((fast, "__getitem__", fast.__getitem__))
        fast.__getitem__ = lambda self, grid: noop
        if hasattr(fast, "launch"):
            saved.append((fast, "launch", fast.launch))
            fast.launch = lambda self, grid, args, kwargs: None
    # a stubbed look-back launch advances a kept head's counts without taking tickets: the
    # heads kept before and during the block are dropped
    scratch.clear()
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        scratch.clear()


def host_time(call: Callable, n: int, clock, warmup: int) -> tuple[float, dict]:
    """(eager wall ms per call, the clock's host time per call of ``n`` calls behind its
    busy-wait) after ``warmup`` calls; the wall sizes the busy-wait."""
    for _ in range(warmup):
        call()
    clock.sync()
    wall_ms = clock.wall(call, n, 1)["wall_ms"]
    return wall_ms, clock.behind_sleep(call, n, wall_ms)


def launch_counts() -> list[dict]:
    """Per samu_tune kernel wrapper that has launched: the kernel's name, its launches
    through the direct path and through ``kernel[grid]``, and why it launches through Triton
    only (None: the direct path is open) -- whether a run's launches took the direct path."""
    from samu_tune import launcher
    rows = [{"kernel": getattr(getattr(w.fn, "fn", None), "__name__", None) or repr(w.fn),
             "direct": w.direct, "normal": w.normal, "reason": w.reason}
            for w in list(getattr(launcher, "WRAPPERS", ())) if w.direct or w.normal]
    return sorted(rows, key=lambda r: r["kernel"])


class _Arity(torch.autograd.Function):
    """Nothing computed, the scan's interface: 10 inputs, 4 outputs [n], 10 tensors saved,
    6 gradients returned (the floor of a Python autograd Function for the scan)."""

    @staticmethod
    def forward(ctx, a, b, c, d, e, f, g, h, i, j):
        ctx.save_for_backward(a, b, c, d, e, f, g, h, i, j)
        return torch.empty_like(a), torch.empty_like(a), torch.empty_like(a), torch.empty_like(a)

    @staticmethod
    def backward(ctx, *grads):
        ctx.saved_tensors
        return (*grads[:2], *grads[:2], *grads[:2], None, None, None, None)


def _arity_calls(device: torch.device, chained: int = 1) -> tuple[Callable, Callable]:
    """(forward, forward+backward) of :class:`_Arity` on [8] tensors; ``chained`` > 1: that
    many, each taking the previous one's first two outputs, one backward at the end."""
    leaves = [torch.zeros(8, device=device, requires_grad=True) for _ in range(6)]
    rest = [torch.zeros(8, device=device) for _ in range(4)]
    ones = [torch.ones(8, device=device)] * 2

    def forward():
        with torch.no_grad():
            return _Arity.apply(*leaves, *rest)

    def forward_backward():
        for t in leaves:
            t.grad = None
        out = _Arity.apply(*leaves, *rest)
        for _ in range(chained - 1):
            out = _Arity.apply(*out[:2], *leaves[2:], *rest)
        torch.autograd.backward(out[:2], ones)
    return forward, forward_backward


def on_calling_thread(call: Callable) -> Callable:
    """``call`` with autograd's engine running every backward node on the calling thread."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return call()
    return run


def op_count(call: Callable) -> int:
    """ATen operators one call of ``call`` dispatches (the call run once more, counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        call()
    return Count.n


def floor_calls(device: torch.device, shape=PROBE_SHAPE) -> dict[str, Callable]:
    """The floor cases: name -> zero-argument call."""
    from samu_tune import launcher
    tensors = [torch.empty(64, device=device) for _ in range(28)]
    ints = (3, 5, 7, 9, 11, 13)
    small = torch.ones(16, device=device)
    arity_fwd, arity_train = _arity_calls(device)
    calls = {
        "Python call (empty)": lambda: None,
        f"torch.empty {list(shape)} bf16": lambda: torch.empty(shape, device=device,
                                                               dtype=torch.bfloat16),
        "torch.zeros 1024 int32 (allocation + fill)": lambda: torch.zeros(
            1024, dtype=torch.int32, device=device),
        "as_strided view [4, 4]": lambda: small.as_strided((4, 4), (4, 1), 0),
        "torch add, 16 elements (one ATen launch)": lambda: small + small,
        "autograd Function, scan arity, forward (no grad)": arity_fwd,
        "autograd Function, scan arity, forward+backward": arity_train,
        "the same, engine on the calling thread": on_calling_thread(arity_train),
        "4 such Functions chained, one backward (per 4)": _arity_calls(device, chained=4)[1],
        "Triton launch, 34 arguments, kernel[grid]": lambda: _probe[(1,)](*tensors, *ints, X=1),
    }
    fast = launcher.fast(_probe) if hasattr(launcher, "fast") else None
    if fast is not None and hasattr(fast, "launch"):
        args, kwargs = (*tensors, *ints), {"X": 1}
        calls["Triton launch, 34 arguments, direct"] = lambda: fast.launch((1, 1, 1), args,
                                                                            kwargs)
    return calls


def stub_pairs(device: torch.device, shape=PROBE_SHAPE) -> dict[str, Callable]:
    """The library calls measured with and without their launches."""
    from benchmarks.bench_host import decode_call, layer_call, scan_call, scan_inputs
    inputs = scan_inputs(shape, device)
    M = 1024 if shape == PROBE_SHAPE else shape[-1]
    return {f"scan forward {shape}": scan_call(inputs, False),
            f"scan forward+backward {shape}": scan_call(inputs, True),
            f"scan forward+backward {shape}, engine on the calling thread":
                on_calling_thread(scan_call(inputs, True)),
            f"layer forward+backward {shape}": layer_call(shape, device, True),
            f"decode step B={DECODE_B} M={M}": decode_call(DECODE_B, M, device)}


def run_floor(plan, clock, device: torch.device, out: dict, save: Callable) -> None:
    from benchmarks.bench_host import guarded
    n = 2 if plan.smoke else 200
    shape = SMOKE_SHAPE if plan.smoke else PROBE_SHAPE
    rows = out.setdefault("floor", [])

    def host(call: Callable, n: int) -> dict:
        return host_time(call, n, clock, plan.warmup)[1]

    for name, call in floor_calls(device, shape).items():
        row = {"case": name, **guarded(name, lambda: host(call, n))}
        rows.append(row)
        _report(name, row)
        save()
    for name, call in stub_pairs(device, shape).items():
        m = 2 if plan.smoke else 30
        row = {"case": name, "full": guarded(name, lambda: host(call, m))}
        with launches_stubbed():
            row["stubbed"] = guarded(name + " (stubbed)", lambda: host(call, m))
            if "error" not in row["stubbed"]:
                row["ops"] = op_count(call)
        rows.append(row)
        _report(name, row["full"], row["stubbed"])
        save()
    # the scan calls again, their time by function, as is and stubbed
    # (benchmarks/host_sections.py)
    from benchmarks.bench_host import scan_call, scan_inputs
    from benchmarks.host_sections import section_times
    sections = out.setdefault("floor_sections", [])
    inputs = scan_inputs(shape, device)
    for what, train in (("forward", False), ("forward+backward", True)):
        call = scan_call(inputs, train)
        for stubbed in (False, True):
            case = f"scan {what} {shape}" + (" (stubbed)" if stubbed else "")
            with launches_stubbed() if stubbed else contextlib.nullcontext():
                row = {"case": case, **guarded(case, lambda: section_times(
                    call, 2 if plan.smoke else 100, clock))}
            sections.append(row)
            print(f"[floor] {case} by section: " + ", ".join(
                f"{k} {v['us']:.1f}" for k, v in row.get("sections", {}).items()), flush=True)
            save()


def _report(name: str, *results: dict) -> None:
    cells = [r["error"][:120] if "error" in r else f"host {r['host_ms'] * 1e3:.1f} us"
             for r in results]
    print(f"[floor] {name}: " + " | ".join(cells), flush=True)


def floor_markdown(rows: list[dict], fmt: Callable) -> list[str]:
    """The floor tables (us per call)."""
    if not rows:
        return []

    def us(r):
        return None if not r or "error" in r else r["host_ms"] * 1e3

    lines = ["", "## Host floor: where a call's host time goes", "",
             "Host us per call behind a GPU busy-wait.  'Launches stubbed': every Triton launch "
             "a no-op (Python, torch allocations and fills, autograd remain).", "",
             "| case | host us/call |", "|---|---|"]
    lines += [f"| {r['case']} | {fmt(us(r))} |" for r in rows if "full" not in r]
    lines += ["", "| call | host us/call | launches stubbed | the launches | ATen ops "
              "(stubbed) |", "|---|---|---|---|---|"]
    for r in rows:
        if "full" in r:
            full, stub = us(r["full"]), us(r["stubbed"])
            diff = full - stub if full is not None and stub is not None else None
            lines.append(f"| {r['case']} | {fmt(full)} | {fmt(stub)} | {fmt(diff)} | "
                         f"{r.get('ops', '-')} |")
    return lines
