"""GPU probe of two unexplained costs (issue 5): the host time ``samu_tune.scan`` adds over a
direct strategy call (0.35 vs 0.10 ms per forward call in the stop-11 grid), and where a
5-second tune spends its time (4 candidates in 8.6 s with 0.7 s of verification and first
calls).

Part A, at (32, 512, 256) bf16: host microseconds per call of the direct lookback call and of
``samu_tune.scan`` (forward under no_grad, and forward + backward), back to back with one
synchronisation at the end, then cProfile of each (top functions by own time), and a
synchronisation check (``torch.cuda.set_sync_debug_mode("error")``).
Part B: ``samu_tune.tune`` of the same problem (forward, budget 5 s) with every progress event
time-stamped, under cProfile (top functions by cumulative time).

    PYTHONPATH=$PWD python3 scripts/probe_host.py [--out DIR]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import samu_tune  # noqa: E402
from samu_tune import registry, timing  # noqa: E402
from samu_tune.problem import ScanProblem  # noqa: E402


def profile(fn, n: int, top: int, sort: str) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(top)
    return s.getvalue()


def per_call_us(fn, n: int = 300) -> float:
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / n * 1e6)
    return best


def part_a(shape, report: dict) -> None:
    B, L, M = shape
    strat = registry.get("lookback")
    for backward in (False, True):
        p = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda", backward=backward)
        cfg = strat.default_config(p)
        step = timing.Step(p, "cuda", pool=1)
        inputs = step.next_inputs()

        def direct(i):
            return strat.run(i, cfg)

        def via_scan(i):
            return samu_tune.scan(i.eta, i.delta, i.nu_log, i.theta_log, i.br, i.bi)

        calls = {"direct": lambda: step(direct, inputs), "scan": lambda: step(via_scan, inputs)}
        for name, call in calls.items():
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            us = per_call_us(call, 100 if backward else 300)
            key = f"{'train' if backward else 'forward'}_{name}_us"
            report[key] = us
            print(f"{key}: {us:.1f}", flush=True)
        d = samu_tune.explain(inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log,
                              inputs.br, inputs.bi)
        print(f"scan's choice: {d.strategy} {d.config} ({d.source}); direct: {cfg}")
        for name, call in calls.items():
            text = profile(call, 200, 22, "tottime")
            report[f"profile_{'train' if backward else 'forward'}_{name}"] = text
            print(f"--- cProfile {name} backward={backward} (200 calls)\n{text}", flush=True)
        try:
            torch.cuda.set_sync_debug_mode("error")
            calls["scan"]()
            report[f"sync_free_{backward}"] = True
        except RuntimeError as exc:
            report[f"sync_free_{backward}"] = str(exc).splitlines()[0]
            print("SYNC in scan:", exc)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def part_b(shape, report: dict) -> None:
    B, L, M = shape
    p = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda")
    # a throwaway tune pays the one-time costs (calibration, flush buffer, imports)
    samu_tune.tune(ScanProblem(B=2, L=256, M=64, dtype="bfloat16", device="cuda"), "forward",
                   max_configs=2)
    events = []
    t0 = time.perf_counter()

    def progress(ev):
        events.append((round(time.perf_counter() - t0, 3), ev.event, ev.phase, ev.candidate,
                       ev.status, ev.time_ms))

    pr = cProfile.Profile()
    pr.enable()
    res = samu_tune.tune(p, "forward", budget_s=5.0, progress=progress)
    pr.disable()
    report["tune_events"] = events
    report["tune_elapsed_s"] = res.elapsed_s
    report["tune_candidates"] = [c.model_dump(mode="json") for c in res.candidates]
    for e in events:
        print(e)
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    report["tune_profile"] = s.getvalue()
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    report["tune_profile_tottime"] = s.getvalue()
    print(s.getvalue(), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", default="32,512,256")
    ap.add_argument("--parts", default="a,b")
    args = ap.parse_args()
    shape = tuple(int(v) for v in args.shape.split(","))
    report: dict = {"shape": shape, "device": torch.cuda.get_device_name()}
    try:
        if "a" in args.parts:
            part_a(shape, report)
        if "b" in args.parts:
            part_b(shape, report)
    finally:
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, "probe_host.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
