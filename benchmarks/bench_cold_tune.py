"""Cold tuning with and without the compile pool: one fresh process per run, an empty Triton
cache and an empty samu_tune cache each time.

    python -m benchmarks.bench_cold_tune --out DIR [--shape 3,5000,300]
        [--mode forward] [--max-configs 24] [--workers 0,8:compile,8:verify]

``--workers``: one run per item, ``N`` or ``N:MODE`` (the pool's ``SAMU_TUNE_COMPILE_MODE``:
``compile``, workers without a GPU compiling only; ``verify``, workers compiling and
verifying on the GPU; see :mod:`samu_tune.compile_pool`); 0 is no pool.
Each run tunes the shape (``samu_tune.tune``, default search, ``max_configs`` candidates, no
time budget) in a new process (``TRITON_CACHE_DIR`` and ``SAMU_TUNE_CACHE_DIR`` pointing at
new directories) and reports the tune's wall time, its candidates (ok / failed / skipped),
the sums of their verification seconds (in the worker when ``verified_in`` is ``worker``),
first calls at the real shape and evaluations, and the pick with its time.  Writes
``cold_tune.json`` and ``cold_tune.md`` under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import add_out, parse_shape, write_json

CHILD = r"""
import json, sys, time
t0 = time.monotonic()
import torch, samu_tune
from samu_tune import tune
from samu_tune.ops.scan.problem import ScanProblem
B, L, M, mode, max_configs, workers, device = json.loads(sys.argv[1])
p = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device=device, backward=mode == "train")
t1 = time.monotonic()
r = tune(p, max_configs=max_configs, compile_workers=workers)
t2 = time.monotonic()
c = r.candidates
print(json.dumps({
    "import_s": t1 - t0, "tune_s": t2 - t1, "candidates": len(c),
    "ok": sum(x.status == "ok" for x in c), "failed": sum(x.status == "failed" for x in c),
    "skipped": sum(x.status == "skipped" for x in c),
    "verified_in_worker": sum(x.verified_in == "worker" for x in c),
    "verified_in_cache": sum(x.verified_in == "cache" for x in c),
    "verify_s": sum(x.verify_s for x in c), "warmup_s": sum(x.warmup_s for x in c),
    "wall_s": sum(x.wall_s for x in c),
    "winner": r.winner.name if r.winner else None,
    "winner_ms": r.winner.time_ms if r.winner else None,
    "failures": [(x.name, (x.reason or "")[:160]) for x in c if x.status == "failed"]}))
"""


def label(row: dict) -> str:
    return f"{row['workers']}" + (f" ({row['pool_mode']})" if row.get("pool_mode") else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(ap, default=None)
    ap.add_argument("--shape", type=parse_shape, default="3,5000,300")
    ap.add_argument("--mode", default="forward", choices=["forward", "train"])
    ap.add_argument("--max-configs", type=int, default=24)
    ap.add_argument("--workers", default="0,8:compile,8:verify")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run under the Triton interpreter (tiny shapes)")
    args = ap.parse_args()
    out = args.out
    B, L, M = args.shape
    rows = []
    for item in args.workers.split(","):
        workers_text, _, pool_mode = item.partition(":")
        workers = int(workers_text)
        with tempfile.TemporaryDirectory() as triton_dir, \
                tempfile.TemporaryDirectory() as cache_dir:
            env = dict(os.environ, TRITON_CACHE_DIR=triton_dir, SAMU_TUNE_CACHE_DIR=cache_dir)
            if pool_mode:
                env["SAMU_TUNE_COMPILE_MODE"] = pool_mode
            if args.device == "cpu":
                env["TRITON_INTERPRET"] = "1"
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-c", CHILD,
                 json.dumps([B, L, M, args.mode, args.max_configs, workers, args.device])],
                env=env, capture_output=True, text=True)
            row = {"workers": workers, "pool_mode": pool_mode or None,
                   "process_s": time.monotonic() - t0}
            try:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                row["error"] = (proc.stderr or proc.stdout)[-2000:]
        rows.append(row)
        print(json.dumps(row), flush=True)
    data = {"shape": [B, L, M], "mode": args.mode, "max_configs": args.max_configs,
            "rows": rows}
    write_json(out / "cold_tune.json", data)
    lines = [f"# Cold tune of ({B}, {L}, {M}) bf16 {args.mode}, {args.max_configs} candidates",
             "", "| workers (mode) | process s | tune s | candidates ok / failed / skipped | "
             "verified in workers | verify s (sum) | first calls s (sum) | pick | pick ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {label(r)} | error: {r['error'][-200:]!r} |")
            continue
        lines.append(f"| {label(r)} | {r['process_s']:.1f} | {r['tune_s']:.1f} | "
                     f"{r['ok']} / {r['failed']} / {r['skipped']} | {r['verified_in_worker']} | "
                     f"{r['verify_s']:.1f} | {r['warmup_s']:.1f} | {r['winner']} | "
                     f"{r['winner_ms']:.4f} |")
    (out / "cold_tune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
