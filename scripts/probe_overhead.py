"""Scratch GPU probe: host (CPU) time per call vs device time, and a kernel-level profile.

    python scripts/probe_overhead.py
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from samu_tune import registry, timing  # noqa: E402
from samu_tune.problem import ScanProblem  # noqa: E402


def main():
    for shape in [(32, 512, 256), (8, 8192, 1024)]:
        B, L, M = shape
        for name in ("lookback", "serial"):
            strat = registry.get(name)
            for backward in (False, True):
                p = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda", backward=backward)
                cfg = strat.default_config(p)
                step = timing.Step(p, "cuda", pool=1)
                inputs = step.next_inputs()
                fn = lambda i: strat.run(i, cfg)  # noqa: E731
                for _ in range(3):
                    step(fn, inputs)
                torch.cuda.synchronize()
                n = 30
                t0 = time.perf_counter()
                for _ in range(n):
                    step(fn, inputs)
                host = (time.perf_counter() - t0) / n * 1e3
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / n * 1e3
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                e0.record()
                for _ in range(n):
                    step(fn, inputs)
                e1.record()
                torch.cuda.synchronize()
                dev = e0.elapsed_time(e1) / n
                print(f"{name:9s} {shape} {'train' if backward else 'fwd  '}: host {host:.3f} ms/call,"
                      f" wall {wall:.3f}, back-to-back events {dev:.3f} ms", flush=True)
                if shape == (32, 512, 256) and name == "lookback":
                    from torch.profiler import ProfilerActivity, profile
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            step(fn, inputs)
                        torch.cuda.synchronize()
                    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14),
                          flush=True)
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14),
                          flush=True)


if __name__ == "__main__":
    main()
