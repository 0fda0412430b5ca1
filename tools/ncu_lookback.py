"""Driver for Nsight Compute: one look-back config at one shape, launched a few times.

    ncu -k regex:lookback_scan --launch-skip 2 --launch-count 1 ... \
        python3 -m tools.ncu_lookback 64x512x4lr2p4 [--shape 8x8192x1024] [--train] [--dtype float32]
    ncu -k regex:lookback_once_forward --launch-skip 2 --launch-count 1 ... \
        python3 -m tools.ncu_lookback 32x256x2l --strategy lookback_once
    ncu -k regex:lookback_once_backward --launch-skip 1 --launch-count 1 ... \
        python3 -m tools.ncu_lookback 32x256x2l --train --strategy lookback_staged

(the NCU phase of ``tools/gpu_run.sh`` runs it so, with the counters below).

Forward: three forward calls (the first compiles); --train: three forward+backward steps
(the reverse kernel is every second lookback_scan launch).  Hardware counters, not times, are
what this is for: DRAM bytes against the 4 (forward) arrays of [B, L, M] the scan must move,
L2 hit rate of the replay's re-read, issue activity and stall reasons.
"""
from __future__ import annotations

import argparse

import torch

from samu_tune import registry, timing
from samu_tune.ops.scan import timing as scan_timing
from samu_tune.ops.scan.problem import ScanProblem

from benchmarks.common import parse_lookback_config, parse_shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a look-back config spec (common.parse_lookback_config)")
    ap.add_argument("--shape", type=parse_shape, default="8x8192x1024")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--strategy", default="lookback",
                    choices=("lookback", "lookback_once", "lookback_staged"),
                    help="lookback_once: its forward is the Gluon kernel lookback_once_forward; "
                         "lookback_staged: so is its forward, and its backward is "
                         "lookback_once_backward")
    args = ap.parse_args()
    B, L, M = args.shape
    cfg = parse_lookback_config(args.config)
    problem = ScanProblem(B=B, L=L, M=M, dtype=args.dtype, device="cuda", backward=args.train)
    strat = registry.get(args.strategy)
    if not strat.valid(problem, cfg):
        ap.error(f"{args.config} is not a valid {args.strategy} config for {problem.key()}")
    inputs = scan_timing.fast_random_inputs(problem, seed=0, device="cuda")
    for _ in range(3):
        if args.train:
            leaves = [t.detach().requires_grad_(True) for t in (inputs.br, inputs.bi)]
            out = strat.run(inputs.replace(br=leaves[0], bi=leaves[1]), cfg)
            (out.real.float().sum() + out.imag.float().sum()).backward()
        else:
            with torch.no_grad():
                strat.run(inputs, cfg)
    torch.cuda.synchronize()
    print("ran", args.config, "x".join(map(str, args.shape)), "train" if args.train else "forward")


if __name__ == "__main__":
    main()
