"""Today's tuner search replayed on recorded exhaustive timings: which pick it makes.

Reads ``bench_tuner.json`` files of :mod:`benchmarks.bench_tuner` and, per case with
exhaustive timings (every candidate of the problem timed on the GPU), runs the current
tuner's search (:func:`samu_tune.tuner._search`: priors from the shipped table of the run's
GPU and, for a train case, the same shape's forward pick; the screen; the refinement with
the patience stop) with each candidate's time looked up in those timings instead of measured
(a candidate the run did not time counts as failed, and is reported).  Forward cases run
first, and each forward pick goes into a temporary user cache, as a ``profile`` run tunes a
shape's forward before its train; every case starts from an empty user cache otherwise.  The pick's time over the exhaustive best is the ratio
issue-style targets ask for (within 2%), here without a GPU and without re-timing: timings
recorded on one run, the search of the current code.

    python -m benchmarks.search_replay benchmarks/results/NVIDIA-H200/s26/tuner/bench_tuner.json \\
        benchmarks/results/NVIDIA-H200/s27/tuner/bench_tuner.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks.common import run_device


def replay_case(case: dict, dev, patience: int) -> dict:
    """The current search on one recorded case: its pick, candidates evaluated, those the run
    did not time, and the pick's exhaustive time over the exhaustive best."""
    import torch
    from samu_tune import registry, tuner
    from samu_tune.evaluate import Search
    from samu_tune.ops.scan.problem import ScanProblem
    from samu_tune.results import Candidate, candidate_name, config_json

    timed = {r["name"]: r["ms"] for r in case["exhaustive"]["rows"] if "ms" in r}
    problem = ScanProblem.from_key(case["key"])
    pairs = registry.eligible(problem, dev)
    runnable = [s for s, r in pairs if not r]
    spaces = {s.name: s.configs(problem) for s in runnable}
    search = Search(problem, dev, torch.device("cpu"), seed=0, budget_s=None, max_configs=None,
                    reps=None, progress=None, max_workspace_bytes=None, patience=patience)
    untimed: list[str] = []

    def looked_up(strategy, config, phase) -> Candidate:
        name = candidate_name(strategy.name, config)
        cand = Candidate(strategy=strategy.name, config=config_json(config), phase=phase,
                         status="failed")
        if name in timed:
            cand.status, cand.time_ms = "ok", timed[name]
        else:
            cand.reason = "not timed in the run"
            untimed.append(name)
        return cand

    search._evaluate = looked_up
    tuner._search(search, problem, dev, runnable, spaces, [], exhaustive=False, prior_top=5,
                  refine_top=2)
    ok = sorted((c for c in search.order if c.status == "ok"), key=lambda c: c.time_ms)
    pick = ok[0] if ok else None
    best = min(timed.values())
    return {"key": case["key"], "problem": problem, "evaluated": len(search.order),
            "names": [candidate_name(c.strategy, c.config) for c in search.order],
            "untimed": untimed, "space": len(timed), "stopped": search.stopped,
            "pick": pick, "ratio": pick.time_ms / best if pick else None,
            "phase": pick.phase if pick else None}


def _remember_forward(row: dict, dev) -> None:
    """The forward pick as the user cache's entry for its problem (train's prior)."""
    from samu_tune import cache, registry
    pick = row["pick"]
    cache.put(cache.CacheEntry(
        key=row["problem"].key(), mode="forward", strategy=pick.strategy, config=pick.config,
        time_ms=pick.time_ms, source_hash=registry.get(pick.strategy).source_hash,
        measured_at="replay", cpu_wall_time=False, versions=dict(cache.versions())),
        dev.signature())


def _forward_key(key: str) -> str:
    """The key of the forward problem of the same shape and features as ``key``."""
    from samu_tune.ops.scan.problem import ScanProblem
    return ScanProblem.from_key(key).model_copy(update={"backward": False}).key()


def replay(files: list[Path], patience: int) -> list[dict]:
    """Each case in a fresh, empty user cache: a forward case as on a new machine (priors
    from the shipped table), a train case with its shape's replayed forward pick stored (of
    the same run where it has one, else another run on that GPU)."""
    from samu_tune import cache
    from samu_tune.settings import reload_settings
    cases = []
    for f in files:
        data = json.loads(f.read_text())
        dev = run_device(data)
        run = "/".join(f.resolve().parts[-4:-2])
        cases += [(run, dev, c) for c in data["cases"]
                  if c.get("exhaustive", {}).get("rows")
                  and c["exhaustive"].get("timed", 0) >= len(c["exhaustive"]["rows"])]
    cases.sort(key=lambda item: item[2]["mode"] != "forward")      # forward first
    rows, forward = [], {}
    for run, dev, case in cases:
        with tempfile.TemporaryDirectory() as empty:
            os.environ["SAMU_TUNE_CACHE_DIR"] = empty
            reload_settings()
            cache.invalidate()
            shape = _forward_key(case["key"])
            if case["mode"] == "train":
                picks = forward.get((dev.signature(), shape), {})
                if picks:
                    _remember_forward(picks.get(run) or next(iter(picks.values())), dev)
            row = {"run": run, **replay_case(case, dev, patience)}
        rows.append(row)
        if case["mode"] == "forward" and row["pick"] is not None:
            forward.setdefault((dev.signature(), _forward_key(case["key"])), {})[run] = row
    cache.invalidate()
    return rows


def main(argv=None) -> None:
    from samu_tune.settings import reload_settings, settings
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_tuner_json", type=Path, nargs="+")
    ap.add_argument("--patience", type=int, default=None,
                    help="default: SAMU_TUNE_TUNE_PATIENCE's default")
    args = ap.parse_args(argv)
    patience = args.patience if args.patience is not None else settings().tune_patience
    saved = os.environ.get("SAMU_TUNE_CACHE_DIR")
    try:
        rows = replay(args.bench_tuner_json, patience)
    finally:
        if saved is None:
            os.environ.pop("SAMU_TUNE_CACHE_DIR", None)
        else:
            os.environ["SAMU_TUNE_CACHE_DIR"] = saved
        reload_settings()
    print(f"patience {patience}\n")
    print("| run | case | evaluated / space (stop) | not timed in the run | pick (phase) "
          "| pick / exhaustive best |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        pick = r["pick"]
        name = "-" if pick is None else (f"{pick.strategy} " + ",".join(
            f"{k}={v}" for k, v in pick.config.items()
            if k in ("chunk", "block_m", "num_warps", "inner", "rows", "lookback_width",
                     "stages")))
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"| {r['run']} | {r['key']} | {r['evaluated']} / {r['space']} ({r['stopped']}) "
              f"| {len(r['untimed'])} | {name} ({r['phase']}) | {ratio} |")
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    print(f"\nwithin 2% of the exhaustive best at {sum(x <= 1.02 for x in ratios)} of "
          f"{len(ratios)}; worst {max(ratios, default=0):.3f}")


if __name__ == "__main__":
    main()
