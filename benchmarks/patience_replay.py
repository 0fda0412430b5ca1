"""The tuner's patience stop replayed on recorded searches: which pick it would have made.

Reads ``bench_tuner.json`` files of :mod:`benchmarks.bench_tuner` whose tunes ran without the
patience stop (or with a longer one) and, per case, walks the tune's candidates in the order
they were evaluated, as :class:`samu_tune.evaluate.Search` counts them: a refinement candidate
that does not beat the best time so far by more than ``MIN_GAIN`` makes the search staler,
a better one resets it, priors and screens never count; at ``patience`` stale candidates in a
row the search stops.  The replayed pick is the fastest candidate evaluated by then (its tune
time), and both it and the whole search's pick are priced with the same run's exhaustive
timings: ``ratio`` = the pick's exhaustive time / the exhaustive best (no re-timing; the
tuner's own re-timing of its final pick is ``bench_tuner``'s ``ratio``).

    python -m benchmarks.patience_replay benchmarks/results/NVIDIA-H200/s26/tuner/bench_tuner.json
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional


def replay(candidates: list[dict], patience: int, min_gain: float) -> tuple[Optional[str], int]:
    """(the replayed pick's name, candidates evaluated before the stop) of one recorded
    search (``candidates``: name, phase, status, time_ms, in evaluation order)."""
    best, stale, pick, pick_t, n = math.inf, 0, None, math.inf, 0
    for cand in candidates:
        if stale >= patience:
            break
        n += 1
        t = cand.get("time_ms") if cand.get("status") == "ok" else None
        t = math.inf if t is None else t
        if t < best * (1.0 - min_gain):
            stale = 0
        elif cand.get("phase") == "refine":
            stale += 1
        best = min(best, t)
        if t < pick_t:
            pick, pick_t = cand["name"], t
    return pick, n


def study(cases: list[dict], patience: int, min_gain: float) -> list[dict]:
    """Per case with a recorded search and exhaustive timings: the replayed and the whole
    search's picks priced by the exhaustive timings."""
    rows = []
    for case in cases:
        cands = case.get("tune", {}).get("candidates") or []
        timed = {r["name"]: r["ms"] for r in case.get("exhaustive", {}).get("rows", [])
                 if "ms" in r}
        if not cands or not timed:
            continue
        best = min(timed.values())
        pick, n = replay(cands, patience, min_gain)
        whole = case["tune"].get("pick")

        def ratio(name):
            return timed[name] / best if name in timed else None
        rows.append({"run": case.get("_run", ""), "key": case["key"], "evaluated": n,
                     "recorded": len(cands),
                     "stopped": case["tune"].get("stopped"), "pick": pick,
                     "ratio": ratio(pick), "whole_ratio": ratio(whole),
                     "same": pick == whole})
    return rows


def main(argv=None) -> None:
    from samu_tune.evaluate import MIN_GAIN
    from samu_tune.settings import settings
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_tuner_json", type=Path, nargs="+")
    ap.add_argument("--patience", type=int, default=settings().tune_patience)
    args = ap.parse_args(argv)
    cases = [{**c, "_run": "/".join(f.resolve().parts[-4:-2])}
             for f in args.bench_tuner_json for c in json.loads(f.read_text())["cases"]]
    rows = study(cases, args.patience, MIN_GAIN)

    def f(x):
        return "-" if x is None else f"{x:.3f}"
    print(f"patience {args.patience}, min gain {MIN_GAIN:.0%}\n")
    print("| run | case | evaluated / recorded (recorded stop) | replayed pick / exhaustive "
          "best | whole search's pick / best | same pick |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['key']} | {r['evaluated']} / {r['recorded']} ({r['stopped']}) | "
              f"{f(r['ratio'])} | {f(r['whole_ratio'])} | {'yes' if r['same'] else 'no'} |")
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    if ratios:
        print(f"\nreplayed: within 2% of the exhaustive best at {sum(x <= 1.02 for x in ratios)}"
              f" of {len(ratios)}; worst {max(ratios):.3f}")


if __name__ == "__main__":
    main()
