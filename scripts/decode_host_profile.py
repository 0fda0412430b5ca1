"""Host cost of one ``SAMU.step`` (issue 7): torch ops, kernel launches, microseconds.

Runs ``layer.step(x, state)`` under ``torch.no_grad()`` (the decode path) for B = 1, 8, 64 at
M = 512 and reports per step:

- ``aten_ops``: torch operator calls seen by a ``TorchDispatchMode`` (allocations, views,
  casts, copies: everything that goes through the dispatcher), and the names of those ops;
- ``launches``: Triton kernel launches and the number of arguments of each;
- ``host_us``: wall time per step of a steady loop, best of 7.

On a CPU the Triton launch is replaced by a stub that only counts (the kernel cannot run
without a GPU, and the interpreter's cost would swamp the host path), so ``host_us`` is the
Python/torch path up to the launch.  On CUDA (``--device cuda``) the real kernel runs and
``host_us`` is the wall time of the loop with one synchronisation at the end (host-bound when
the kernel is shorter than the host path).  ``--out-buffers`` passes ``out=`` and
``state_out=state`` (the allocation-free, in-place form) when the layer supports it.

    PYTHONPATH=. python scripts/decode_host_profile.py [--device cpu|cuda] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import samu_tune  # noqa: E402
from samu_tune.kernels import decode as kernels_decode  # noqa: E402


class OpCounter(TorchDispatchMode):
    """Counts every aten operator call (below autograd)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    """Stands in for a ``@triton.jit`` kernel: counts ``kernel[grid](*args, **kwargs)`` calls.

    ``forward=True`` also launches the real kernel (CUDA); else the launch is skipped.
    """

    def __init__(self, kernel, forward: bool):
        self.kernel, self.forward = kernel, forward
        self.calls = 0
        self.arg_counts = []

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls += 1
            self.arg_counts.append((len(args), len(kwargs)))
            if self.forward:
                return self.kernel[grid](*args, **kwargs)
            return None
        return launch


def _kernel_names():
    return [n for n, v in vars(kernels_decode).items()
            if hasattr(v, "fn") and hasattr(v, "run") and n.startswith("samu_decode")]


def profile(device: str, batches, M: int, use_out: bool, calls: int):
    torch.manual_seed(0)
    layer = samu_tune.SAMU(M, device=device)
    forward = device == "cuda"
    counters = {n: LaunchCounter(getattr(kernels_decode, n), forward) for n in _kernel_names()}
    originals = {n: getattr(kernels_decode, n) for n in counters}
    supports_out = "state_out" in inspect.signature(layer.step).parameters
    rows = []
    try:
        for n, c in counters.items():
            setattr(kernels_decode, n, c)
        for B in batches:
            x = torch.randn(B, 2 * M, device=device, dtype=torch.bfloat16)
            state = tuple(torch.randn(B, M, device=device) * 0.5 for _ in range(2))
            kwargs = {}
            if use_out and supports_out:
                kwargs = {"out": torch.empty_like(x), "state_out": state}

            def step():
                return layer.step(x, state, **kwargs)

            with torch.no_grad():
                for _ in range(3):
                    step()  # warm caches (and compile on CUDA)
                for c in counters.values():
                    c.calls, c.arg_counts = 0, []
                with OpCounter() as oc:
                    step()
                launches = sum(c.calls for c in counters.values())
                args = [a for c in counters.values() for a in c.arg_counts]
                best = float("inf")
                for _ in range(7):
                    if forward:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        step()
                    if forward:
                        torch.cuda.synchronize()
                    best = min(best, (time.perf_counter() - t0) / calls)
            row = {"B": B, "M": M, "device": device, "out_buffers": bool(kwargs),
                   "aten_ops": sum(oc.ops.values()), "ops": dict(oc.ops),
                   "launches": launches, "launch_args": args, "host_us": best * 1e6}
            print(f"B={B:3d} M={M} out_buffers={bool(kwargs)!s:5s}: {row['aten_ops']:3d} aten ops "
                  f"{dict(oc.ops)}, {launches} launch(es) {args}, {row['host_us']:.1f} us/step",
                  flush=True)
            rows.append(row)
    finally:
        for n, k in originals.items():
            setattr(kernels_decode, n, k)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--M", type=int, default=512)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        # The stubbed launch needs the kernel path chosen on CPU tensors: pretend the
        # interpreter is on (nothing is interpreted, the stub never launches).
        from samu_tune import settings as settings_mod
        os.environ["TRITON_INTERPRET"] = "1"
        settings_mod.reload_settings()
    rows = []
    for use_out in (False, True):
        rows += profile(args.device, args.batches, args.M, use_out, args.calls)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
