"""How well a search that starts from what is known picks, replayed on measured times.

Reads a ``bench.json`` of :mod:`benchmarks.bench_scan` (every candidate it timed at every grid
shape, GPU time) and, per (shape, dtype, mode), replays two short searches on those times:

- ``priors``: the winners of the other grid problems with the prior features
  (``ScanProblem.prior_features``: dtype, mode, M's alignment; left out: this one's),
  nearest first in log-space of (B*M, L) as the tuner's priors, at most
  ``--priors`` distinct configs;
- ``priors+defaults``: those, then each strategy's default config for the shape (the current
  code's ``default()``; one not in the file is skipped);
- ``priors+forward`` (train): the same shape's forward winner and runner-up, then the priors
  (the tuner's order when forward was tuned first), at most ``--priors`` configs.

And ``served``: what ``cached`` mode serves for the problem when it has no entry of its own
and the other grid problems are the tuned entries (the nearest one's winner, nearest in
log-space of (B*M, L) as :func:`samu_tune.cache.nearest`): its time over the best, or ``-``
when the file did not time that config at this shape.

The pick is the fastest of the candidates a search would time; the table gives its time over
the best of every candidate in the file (1.000: the same pick) and how many it times.  No GPU
is needed: the times are the file's.

    python -m benchmarks.search_study benchmarks/results/NVIDIA-H200/s16/final/grid/bench.json
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks.common import config_key, timed_configs


def study(data: dict, n_priors: int) -> list[dict]:
    from samu_tune import registry
    from samu_tune.ops.scan.problem import ScanProblem

    times = timed_configs(data["rows"])
    winners = {p: min(t, key=t.get) for p, t in times.items()}
    problems = {(shape, dtype, mode): ScanProblem(B=shape[0], L=shape[1], M=shape[2],
                                                  dtype=dtype, backward=mode == "train")
                for shape, dtype, mode in times}
    features_of = {p: problem.feature_key() for p, problem in problems.items()}
    out = []
    for (shape, dtype, mode), cands in sorted(times.items()):
        B, L, M = shape
        here = (math.log(B * M), math.log(L))

        def dist(other):
            (b, l, m), _, _ = other
            return math.hypot(math.log(b * m) - here[0], math.log(l) - here[1])
        # served: the same features (dtype, mode, M's alignment, narrow: ScanProblem.
        # feature_key); priors: those of ScanProblem.prior_features, as the tuner's
        problem = problems[(shape, dtype, mode)]
        prior_features = problem.prior_features()
        near = sorted((p for p in winners if p != (shape, dtype, mode)), key=dist)
        others = [p for p in near if features_of[p] == features_of[(shape, dtype, mode)]]
        prior_from = [p for p in near if features_of[p] in prior_features]
        priors: list[str] = []
        for p in prior_from:
            w = winners[p]
            if w in cands and w not in priors:
                priors.append(w)
            if len(priors) == n_priors:
                break
        # a train tune after the same shape's forward one: its winner and runner-up first
        fwd = times.get((shape, dtype, "forward")) if mode == "train" else None
        fwd_two = sorted(fwd, key=fwd.get)[:2] if fwd else []
        with_forward = []
        for k in [k for k in fwd_two if k in cands] + priors:
            if k not in with_forward and len(with_forward) < n_priors:
                with_forward.append(k)
        defaults = []
        for s in registry.all_strategies():
            if s.name == "reference" or s.reasons(problem):
                continue
            k = config_key(s.name, s.default_config(problem).model_dump(mode="json"))
            if k in cands and k not in priors:
                defaults.append(k)
        best = min(cands.values())
        row = {"shape": shape, "dtype": dtype, "mode": mode, "candidates": len(cands),
               "best": best}
        for label, keys in (("priors", priors), ("priors+defaults", priors + defaults),
                            ("priors+forward", with_forward if mode == "train" else [])):
            row[label] = (min(cands[k] for k in keys) / best if keys else None, len(keys))
        served = winners[others[0]] if others else None
        row["served"] = cands[served] / best if served in cands else None
        out.append(row)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--priors", type=int, default=5, help="priors per problem (tuner: 5)")
    args = ap.parse_args(argv)
    rows = study(json.loads(args.bench_json.read_text()), args.priors)
    print("| (B, L, M) dtype mode | candidates in file | priors: pick / best (timed) "
          "| priors+defaults: pick / best (timed) | train: the forward entry's two, then priors "
          "| served (cached mode) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[k][0]:.3f} ({r[k][1]})" if r[k][0] is not None else f"- ({r[k][1]})"
                 for k in ("priors", "priors+defaults", "priors+forward")]
        served = f"{r['served']:.3f}" if r["served"] is not None else "-"
        print(f"| {r['shape']} {r['dtype']} {r['mode']} | {r['candidates']} | {cells[0]} "
              f"| {cells[1]} | {cells[2] if r['mode'] == 'train' else ''} | {served} |")
    for k in ("priors", "priors+defaults", "priors+forward"):
        kept = [r for r in rows if k != "priors+forward" or r["mode"] == "train"]
        ratios = [r[k][0] for r in kept if r[k][0] is not None]
        within = sum(x <= 1.02 for x in ratios)
        print(f"{k}: within 2% of the file's best at {within} of {len(ratios)}; worst "
              f"{max(ratios):.3f}; mean candidates timed "
              f"{sum(r[k][1] for r in kept) / len(kept):.1f}")
    ratios = [r["served"] for r in rows if r["served"] is not None]
    print(f"served: timed in the file at {len(ratios)} of {len(rows)}; within 2% of the best "
          f"at {sum(x <= 1.02 for x in ratios)}, within 10% at {sum(x <= 1.10 for x in ratios)}; "
          f"worst {max(ratios):.3f}")


if __name__ == "__main__":
    main()
