"""Tune the decode step by batch size on the GPU and compare with the rule.

For each B of ``--batches`` at ``--modes`` M (bf16, state given) this runs
``samu_tune.tune(DecodeProblem(...))`` (verification against the float64 ``step_reference``,
GPU time behind a busy-wait, host time per call beside it), stores the winner in a private
cache under ``$OUT`` (or a temporary dir), and prints per problem the winner, its GPU and host
time, the rule's choice and its time, and what ``decode_step(strategy="auto")`` resolves to
afterwards (it must be the winner, source ``exact``).  Results go to ``$OUT/tune_decode.json``
and the cache file to ``$OUT/cache/``.

    python -m tools.tune_decode [--batches 1,4,16,32,64,256] [--modes 512,1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

# before samu_tune is imported (its settings are read once)
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="tune_decode_"))
os.environ["SAMU_TUNE_CACHE_DIR"] = str(OUT / "cache")

import torch  # noqa: E402

import samu_tune  # noqa: E402
from samu_tune import cache  # noqa: E402
from samu_tune.results import candidate_name  # noqa: E402
from samu_tune.ops.decode import step as decode  # noqa: E402
from samu_tune.ops.decode.spec import random_inputs  # noqa: E402
from samu_tune.ops.decode.problem import DecodeProblem  # noqa: E402
from samu_tune.rules import rule_choice  # noqa: E402

from benchmarks.common import write_json  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,32,64,256")
    ap.add_argument("--modes", default="512,1024")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run under TRITON_INTERPRET=1 (tiny sizes)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)")
        return 2
    rows = []
    for M in (int(m) for m in args.modes.split(",")):
        for B in (int(b) for b in args.batches.split(",")):
            problem = DecodeProblem(B=B, M=M, dtype=args.dtype, device=args.device)
            result = samu_tune.tune(problem, budget_s=args.budget, save=True)
            w = result.winner
            rule = rule_choice(problem)
            rule_name = candidate_name(rule.strategy.name,
                                                       rule.config.model_dump())
            rule_ms = next((c.time_ms for c in result.ranked() if c.name == rule_name), None)
            inputs = random_inputs(problem, seed=0, device=args.device)
            d = decode.decision(inputs.x, M, inputs.state)
            row = dict(key=problem.key(), winner=w.name if w else None,
                       time_ms=w.time_ms if w else None, host_ms=w.host_ms if w else None,
                       margin=result.margin, rule=rule_name, rule_ms=rule_ms,
                       auto=candidate_name(d.strategy.name,
                                                           d.config.model_dump()),
                       auto_source=d.source, evaluated=len(result.candidates),
                       failed=[(c.name, c.reason) for c in result.failed()])
            rows.append(row)
            print(f"{row['key']:26s} winner {row['winner']} {row['time_ms']:.4g} ms "
                  f"(host {row['host_ms'] or 0:.3g} ms, +{100 * (row['margin'] or 0):.0f}% to "
                  f"runner-up); rule {rule_name} {rule_ms if rule_ms is None else f'{rule_ms:.4g} ms'}; "
                  f"auto -> {row['auto']} ({row['auto_source']}); {len(row['failed'])} failed",
                  flush=True)
    write_json(OUT / "tune_decode.json", dict(rows=rows))
    print(f"cache file: {cache.path()}")
    ok = all(r["winner"] and r["auto"] == r["winner"] and r["auto_source"] == "exact"
             and not r["failed"] for r in rows)
    print("OK" if ok else "CHECK: a problem without a winner, a failed candidate, or auto "
          "not resolving to the winner")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
