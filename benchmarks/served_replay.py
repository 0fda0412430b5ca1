"""What ``cached`` mode serves today, priced by a recorded off-grid run's GPU times.

Reads a ``bench.json`` of :mod:`benchmarks.bench_scan` run with ``--served`` (every
candidate it timed at each shape, and what ``samu_tune.scan`` served then) and, per (shape,
dtype, mode), asks the current code what ``cached`` mode would serve on that run's GPU (its
signature; no Triton interpreter, so the Gluon strategies stay eligible) with an empty user
cache (the shipped table of the run's signature, else the rule): its strategy,
config and source, and its time in the file over the best timed there (``-`` when the run did
not time that config at that shape).  No GPU is needed; nothing is re-timed, so a served
config the run never timed has no figure.  It checks a change of the rule or of the
nearest-key features against measured times before a GPU run.

    python -m benchmarks.served_replay benchmarks/results/NVIDIA-H200/s39/offgrid_served/bench.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks.common import config_key, run_device, timed_configs


def replay(data: dict) -> list[dict]:
    """One row per (shape, dtype, mode): the served choice now, its source and its time over
    the file's best (None where not timed), and the ratio the run recorded."""
    from samu_tune import dispatch
    from samu_tune.settings import overridden
    from samu_tune.ops.scan.problem import ScanProblem

    dev = run_device(data)
    times = timed_configs(data["rows"])
    recorded = {(tuple(s["shape"]), s["dtype"], mode): s.get(f"{mode}_vs_best")
                for s in data.get("served", ()) for mode in ("forward", "train")}
    # as on the run's GPU, and without the Triton interpreter (which rules the Gluon
    # strategies out) there
    with overridden(interpret=False):
        out = []
        for (shape, dtype, mode), cands in sorted(times.items()):
            problem = ScanProblem(B=shape[0], L=shape[1], M=shape[2], dtype=dtype,
                                  backward=mode == "train")
            d = dispatch.choose(problem, policy="cached", allow_tune=False, on=dev)
            k = config_key(d.strategy.name, d.config.model_dump(mode="json"))
            best = min(cands.values())
            out.append({"shape": shape, "dtype": dtype, "mode": mode,
                        "choice": f"{d.strategy.name} {d.source} {d.source_key or ''}".strip(),
                        "ratio": cands[k] / best if k in cands else None,
                        "recorded": recorded.get((shape, dtype, mode))})
        return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path)
    args = ap.parse_args(argv)
    data = json.loads(args.bench_json.read_text())
    with tempfile.TemporaryDirectory() as empty:
        os.environ["SAMU_TUNE_CACHE_DIR"] = empty                # no user cache
        from samu_tune.settings import reload_settings
        reload_settings()
        rows = replay(data)
    print("| (B, L, M) dtype mode | served now (source) | its time / best timed "
          "| served in the run / best |")
    print("|---|---|---|---|")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        rec = f"{r['recorded']:.3f}" if r["recorded"] is not None else "-"
        print(f"| {r['shape']} {r['dtype']} {r['mode']} | {r['choice']} | {ratio} | {rec} |")
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    print(f"served now: timed in the file at {len(ratios)} of {len(rows)}; within 10% of the "
          f"best at {sum(x <= 1.10 for x in ratios)}; worst {max(ratios, default=0):.3f}")


if __name__ == "__main__":
    main()
