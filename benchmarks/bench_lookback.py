"""Quick GPU timing of ``lookback`` configs against ``serial`` at the long-L shapes.

    python -m benchmarks.bench_lookback [--out DIR] [--shapes 8x8192x1024,...] [--all]
        [--configs [once:]CHUNKxBLOCK_MxWARPS[xSUB][c][l][r2][wN][pN],...] [--warm N]

For each shape (bf16 data, fp32 controls) and config: a correctness check against the serial
strategy (relative norm, bf16 tolerances, forward and gradients), then forward and
forward+backward times (median of device-event samples, L2 flushed, rotating fresh inputs:
samu_tune.timing) and the fraction of copy bandwidth: forward moves 4 arrays of [B, L, M]
(read br, bi; write real, imag), forward+backward about 10.  First-call seconds (compile)
are reported too, and the GPU kernel time of one step (sum of the kernels' device times
under torch.profiler: no host time) beside the event time.  ``--configs`` picks configs
(specs of :func:`benchmarks.common.parse_lookback_config`: a trailing ``c``: chained
look-back, ``l``: loop-inner, both: ``cl``; then ``r2``: two rows per loop step, ``wN``:
look-back width N, ``pN``: N pipeline stages; prefixed ``once:``, the ``lookback_once``
strategy at that config); ``--warm N`` compiles them first in N
processes (Triton's disk cache is shared).  Writes DIR/bench_lookback.json when --out is
given.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from samu_tune import registry, timing
from samu_tune.ops.scan import timing as scan_timing
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies.lookback import LookbackConfig
from samu_tune.tolerances import TOLERANCES, relative_error

from benchmarks.common import (copy_bandwidth_tbps, error_text, floor_ms, lookback_spec,
                               parse_lookback_config, parse_shapes, warm_all, write_json)

SHAPES = [(8, 8192, 1024), (1, 16384, 256), (2, 65536, 128), (32, 512, 256)]
CONFIGS = [LookbackConfig(chunk=c, block_m=m, num_warps=w, lookback=mode, window=win)
           for c, m, w, mode, win in [
               (32, 32, 4, "decoupled", 1), (64, 32, 4, "decoupled", 1),
               (16, 64, 4, "decoupled", 1), (32, 64, 8, "decoupled", 1),
               (64, 64, 8, "decoupled", 1), (64, 16, 4, "decoupled", 1),
               (128, 16, 8, "decoupled", 1), (128, 32, 8, "decoupled", 1),
               (16, 128, 8, "decoupled", 1), (16, 32, 2, "decoupled", 1),
               (32, 32, 4, "chained", 1), (32, 32, 4, "chained", 8),
               (64, 32, 4, "chained", 32)]] + [
    LookbackConfig(chunk=c, block_m=m, num_warps=w, sub=sub)
    for c, m, w, sub in [(32, 32, 4, 4), (16, 64, 4, 4), (32, 16, 2, 4), (16, 32, 2, 4),
                         (32, 32, 4, 16), (16, 64, 4, 16)]]


def _parse(spec: str) -> tuple[str, LookbackConfig]:
    """(strategy name, config) of a spec, ``once:`` naming ``lookback_once``."""
    prefix, _, body = spec.rpartition(":")
    return ("lookback_once" if prefix == "once" else "lookback"), parse_lookback_config(body)


def kernel_ms(step, fn, n: int = 10) -> tuple[float, dict]:
    """GPU time of one step: the kernels' device times summed (profiler), per step; and per
    kernel name, its launches and microseconds per step."""
    from torch.profiler import ProfilerActivity, profile
    inputs = [step.next_inputs() for _ in range(n)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in inputs:
            step(fn, i)
        torch.cuda.synchronize()
    kernels = {e.key: (e.count / n, e.device_time_total / n) for e in prof.key_averages()
               if e.device_type.name == "CUDA"}
    return sum(us for _, us in kernels.values()) / 1e3, kernels


def _outputs_and_grads(fn, inputs, upstream):
    leaves = [t.detach().requires_grad_(True) for t in inputs.differentiable()]
    eta, delta, nu_log, theta_log, br, bi = leaves
    out = fn(inputs.replace(eta=eta, delta=delta, nu_log=nu_log, theta_log=theta_log, br=br,
                            bi=bi))
    grads = torch.autograd.grad((out.real, out.imag), leaves, upstream)
    return [out.real, out.imag, *grads]


def check(strat, cfg, reference, inputs, upstream) -> str | None:
    got = _outputs_and_grads(lambda i: strat.run(i, cfg), inputs, upstream)
    tol = TOLERANCES["bfloat16"]
    bad = []
    for i, (g, w) in enumerate(zip(got, reference)):
        err = relative_error(g, w)
        if not err <= (tol.forward if i < 2 else tol.gradient):
            bad.append(f"#{i} rel err {err:.3g}")
    return "; ".join(bad) or None


def time_mode(strat, cfg, problem, backward: bool) -> tuple[float, float, float, dict]:
    """(first-call seconds, median ms of event samples, kernel ms, per kernel: launches and
    microseconds per step)."""
    p = problem.model_copy(update={"backward": backward})
    step = scan_timing.Step(p, "cuda", pool=2)
    fn = lambda i: strat.run(i, cfg)  # noqa: E731
    t0 = time.perf_counter()
    step(fn, step.next_inputs())
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    est = timing.median(timing.sample(step, fn, 3))
    n = timing.reps_for(est, device=torch.device("cuda"), target_ms=300, lo=5, hi=50)
    return (first, timing.median(timing.sample(step, fn, n))) + kernel_ms(step, fn)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    ap.add_argument("--all", action="store_true", help="every valid config (slow: compiles)")
    ap.add_argument("--configs", default="",
                    help="comma list of config specs (see common.parse_lookback_config)")
    ap.add_argument("--warm", type=int, default=0, help="compile in this many processes first")
    ap.add_argument("--no-serial", action="store_true", help="skip timing the serial strategy")
    ap.add_argument("--kernels", action="store_true",
                    help="print each config's kernels: microseconds and launches per step")
    args = ap.parse_args()
    chosen = [_parse(s) for s in args.configs.split(",") if s] or [
        ("lookback", c) for c in CONFIGS]
    if args.warm:
        warm_all([("strategy", name, c.model_dump(), (2, 300, 72), "bfloat16",
                   ("forward", "train")) for name, c in chosen], args.warm)
    shapes = parse_shapes(args.shapes)
    bw = copy_bandwidth_tbps()
    print(f"copy bandwidth {bw:.2f} TB/s  ({torch.cuda.get_device_name()})")
    lookback, serial = registry.get("lookback"), registry.get("serial")
    rows = []
    for B, L, M in shapes:
        problem = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda")
        inputs = scan_timing.fast_random_inputs(problem, seed=0, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(1)
        upstream = [torch.randn(B, L, M, generator=g, device="cuda").to(torch.bfloat16)
                    for _ in range(2)]
        reference = _outputs_and_grads(lambda i: serial.run(i, serial.default(problem)),
                                       inputs, upstream)
        floor_fwd = floor_ms((B, L, M), "bfloat16", "forward", bw)   # ms at copy bandwidth
        floor_train = floor_ms((B, L, M), "bfloat16", "train", bw)
        configs = [("lookback", c) for c in lookback.configs(problem)] if args.all else [
            (name, c) for name, c in chosen if registry.get(name).valid(problem, c)]
        cands = [] if args.no_serial else [("serial", serial, serial.default(problem))]
        cands += [(name, registry.get(name), c) for name, c in configs]
        print(f"\n== B={B} L={L} M={M} bf16: floor fwd {floor_fwd:.3f} ms, "
              f"fwd+bwd {floor_train:.3f} ms")
        for name, strat, cfg in cands:
            row = dict(shape=[B, L, M], strategy=name, config=cfg.model_dump())
            try:
                row["error"] = check(strat, cfg, reference, inputs, upstream)
                (row["first_fwd_s"], row["fwd_ms"], row["fwd_kernel_ms"],
                 row["fwd_kernels"]) = time_mode(strat, cfg, problem, False)
                (row["first_train_s"], row["train_ms"], row["train_kernel_ms"],
                 row["train_kernels"]) = time_mode(strat, cfg, problem, True)
                row["fwd_bw"] = floor_fwd / row["fwd_ms"]
                row["train_bw"] = floor_train / row["train_ms"]
                print(f"{name:13s} {lookback_spec(cfg):16s} fwd {row['fwd_ms']:.3f} ms "
                      f"({100 * row['fwd_bw']:4.0f}%)  fwd+bwd {row['train_ms']:.3f} ms "
                      f"({100 * row['train_bw']:4.0f}%)  kernels {row['fwd_kernel_ms']:.3f}/"
                      f"{row['train_kernel_ms']:.3f}  first {row['first_fwd_s']:.1f}+"
                      f"{row['first_train_s']:.1f} s  {row['error'] or 'ok'}", flush=True)
                if args.kernels:
                    for mode in ("fwd", "train"):
                        for key, (count, us) in sorted(row[f"{mode}_kernels"].items(),
                                                       key=lambda kv: -kv[1][1]):
                            print(f"    {mode:5s} {us:8.1f} us  x{count:g}  {key[:90]}")
            except Exception as exc:  # keep benchmarking the others
                row["error"] = error_text(exc)
                print(f"{name:9s} {cfg.model_dump()} FAILED {row['error']}", flush=True)
            rows.append(row)
            if args.out:
                _save(args.out, bw, rows)


def _save(out: Path, bw: float, rows: list) -> None:
    """After every row: a run stopped at its time limit keeps what it measured."""
    write_json(out / "bench_lookback.json",
               dict(copy_tbps=bw, device=torch.cuda.get_device_name(), rows=rows))


if __name__ == "__main__":
    main()
