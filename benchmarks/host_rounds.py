"""Host time of two trees measured in alternating rounds, paired per round.

A device host's speed drifts within one call by more than the host-path changes it is asked
to measure (an H100 host ran the same training call 0.39-0.88 ms in one half of a call and
0.75-0.97 ms in the other).  ``tools/gpu_run.sh`` with ``HOST_ROUNDS`` > 1 and
``HOST_BASELINE`` therefore runs ``bench_host`` on this tree and on the baseline tree in
turns (odd rounds this tree first, even rounds the baseline first, so that a steady drift
cancels), each into ``DIR/r<n>/``, and this module reads them back::

    python -m benchmarks.host_rounds HEAD_DIR BASE_DIR [--out FILE.md]

Per (part, shape, mode): each tree's median host time per call over the rounds, and the
median over rounds of the paired ratio this / baseline (the two runs of one round are
adjacent in time: the drift between them is the smallest the method can reach), with its
range.  A ratio below 1 means this tree's host path is faster.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Optional

# bench_host's parts whose rows carry samu_tune's host time per call
_PARTS = ("scan", "layer", "decode")


def round_dirs(root: Path) -> dict[int, Path]:
    """Round number -> ``root/r<n>`` for the rounds that hold a bench_host.json (a run that
    failed before its first row left none)."""
    return {int(d.name[1:]): d for d in root.glob("r*")
            if d.name[1:].isdigit() and (d / "bench_host.json").is_file()}


def _row_key(part: str, row: dict) -> tuple:
    """(part, shape, mode): a scan or layer row's (B, L, M) and mode; a decode row's (B, M)
    and "step"."""
    shape = row.get("shape") or [row.get("B"), row.get("M")]
    return part, tuple(shape), row.get("mode") or "step"


def host_times(path: Path) -> dict[tuple, float]:
    """(part, shape, mode) -> samu_tune's host ms per call, from one bench_host.json (rows
    without a host time, e.g. a failed case, are left out)."""
    data = json.loads(path.read_text())
    out = {}
    for part in _PARTS:
        for row in data.get(part, []):
            # a scan row keeps samu_tune's figures beside accelerated-scan's; the others hold
            # samu_tune's alone
            ms = (row.get("samu_tune") or row).get("host_ms")
            if isinstance(ms, (int, float)):
                out[_row_key(part, row)] = float(ms)
    return out


def paired(head: dict[int, dict[tuple, float]], base: dict[int, dict[tuple, float]]
           ) -> list[dict]:
    """Per key present in both trees (``{round: times}`` each): each tree's median over its
    rounds, and the ratios of the rounds both trees have it in, paired by round number."""
    keys = sorted({k for run in head.values() for k in run}
                  & {k for run in base.values() for k in run},
                  key=lambda k: (k[0], k[1], str(k[2])))
    both = sorted(head.keys() & base.keys())
    rows = []
    for key in keys:
        h = [run[key] for run in head.values() if key in run]
        b = [run[key] for run in base.values() if key in run]
        ratios = [head[n][key] / base[n][key] for n in both
                  if key in head[n] and key in base[n] and base[n][key] > 0]
        rows.append({"part": key[0], "shape": list(key[1]), "mode": key[2],
                     "head_ms": statistics.median(h), "base_ms": statistics.median(b),
                     "ratios": ratios,
                     "ratio": statistics.median(ratios) if ratios else None})
    return rows


def markdown(rows: list[dict], rounds: int, head: str, base: str) -> str:
    def f(x: Optional[float], fmt: str = ".3f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = [f"# Host time per call, {head} against {base}, {rounds} rounds run by both", "",
             "ms per call, each tree's median over its rounds; ratio = median over the rounds "
             "both ran of (this / baseline) within a round, with its range (below 1: this "
             "tree faster).",
             "", "| part | shape | mode | this ms | baseline ms | ratio | range |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        span = (f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f}" if r["ratios"] else "-")
        lines.append(f"| {r['part']} | {tuple(r['shape'])} | {r['mode']} | {f(r['head_ms'])} | "
                     f"{f(r['base_ms'])} | {f(r['ratio'])} | {span} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head", type=Path, help="this tree's bench_host rounds (DIR/r<n>/)")
    ap.add_argument("base", type=Path, help="the baseline tree's rounds")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    head_dirs, base_dirs = round_dirs(args.head), round_dirs(args.base)
    if not head_dirs or not base_dirs:
        print(f"no rounds (r<n>/bench_host.json) under {args.head if not head_dirs else args.base}",
              file=sys.stderr)
        return 1
    head = {n: host_times(d / "bench_host.json") for n, d in head_dirs.items()}
    base = {n: host_times(d / "bench_host.json") for n, d in base_dirs.items()}
    rows = paired(head, base)
    text = markdown(rows, len(head.keys() & base.keys()), str(args.head), str(args.base))
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
