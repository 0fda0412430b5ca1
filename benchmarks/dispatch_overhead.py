"""Host overhead of ``samu_tune.scan`` over calling the chosen strategy directly.

A trivial strategy (returns its inputs, no kernel) is registered and cached as the exact
winner of the measured problem (so neither the shipped tables nor the rules decide), and what
is measured is validation + the memoized decision + the call: the cost a cache hit adds to
every scan call.  Runs on CUDA tensors when a GPU is present (target: under 20 us), else
on CPU tensors.  Uses a private temporary cache dir.

    python -m benchmarks.dispatch_overhead [--calls 2000] [--device cuda|cpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

# before samu_tune is imported (its settings are read once)
os.environ["SAMU_TUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="samu_tune_overhead_")

import torch  # noqa: E402

import samu_tune  # noqa: E402
from samu_tune import cache, dispatch, registry  # noqa: E402
from samu_tune.device import device_info  # noqa: E402
from samu_tune.ops.scan.problem import ScanProblem  # noqa: E402
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import Strategy  # noqa: E402
from samu_tune.ops.scan.tensors import ScanOutput  # noqa: E402
from samu_tune.ops.scan.validation import validate  # noqa: E402
from samu_tune.ops.scan.api import problem_of  # noqa: E402
from samu_tune.ops.scan.verify import random_inputs  # noqa: E402

from benchmarks.common import per_call_us  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    trivial = registry.register(Strategy(
        name="trivial_overhead_probe", description="returns its inputs",
        capability=Capability(devices=frozenset({"cpu", "cuda"}), triton=False),
        run=lambda inputs, cfg: ScanOutput(inputs.br, inputs.bi), priority=10**6))
    problem = ScanProblem(B=4, L=1024, M=256, dtype="bfloat16", device="cpu", backward=False)
    inp = random_inputs(problem, seed=0, device=args.device)
    call = (inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    cfg = trivial.default_config(problem)
    actual = problem_of(validate(*call))
    dev = device_info(args.device)
    cache.put(cache.CacheEntry(
        key=actual.key(), mode="forward", strategy=trivial.name, config={}, time_ms=0.001,
        source_hash=trivial.source_hash, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        cpu_wall_time=args.device == "cpu", versions=dict(cache.versions()), search="probe"),
        dev)
    samu_tune.scan(*call)  # the first call: decided once, memoized
    decided = dispatch.choose(actual)
    assert decided.strategy is trivial, decided

    direct = per_call_us(lambda: trivial.run(inp, cfg), args.calls)
    validation = per_call_us(lambda: validate(*call), args.calls)
    auto = per_call_us(lambda: samu_tune.scan(*call), args.calls)
    forced = per_call_us(lambda: samu_tune.scan(*call, strategy=trivial.name), args.calls)
    with torch.no_grad():
        no_grad = per_call_us(lambda: samu_tune.scan(*call), args.calls)
    print(f"device: {args.device} ({samu_tune.cache.signature_of(None)}), "
          f"torch {torch.__version__}")
    print(f"direct strategy call        {direct:8.2f} us")
    print(f"validate() alone            {validation:8.2f} us")
    print(f"scan(auto), cache hit       {auto:8.2f} us  overhead {auto - direct:8.2f} us")
    print(f"scan(auto) under no_grad    {no_grad:8.2f} us  overhead {no_grad - direct:8.2f} us")
    print(f"scan(strategy=name)         {forced:8.2f} us  overhead {forced - direct:8.2f} us")
    target = 20.0 if args.device == "cuda" else 200.0
    verdict = "OK" if auto - direct < target else "OVER TARGET"
    print(f"dispatch overhead {auto - direct:.2f} us (target < {target:.0f} us): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
