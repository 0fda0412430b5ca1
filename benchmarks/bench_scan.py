"""One-run GPU benchmark of every strategy, the tuned scan, the seed and accelerated-scan.

Run on the device machine (the grid phase of tools/gpu_run.sh)::

    python -m benchmarks.bench_scan --out DIR [--shapes grid] [--accel] [--served] [--ship-bench]

``--served`` also times ``samu_tune.scan`` as ``cached`` mode serves each shape from the
shipped table or the rule (an empty user cache), against the fastest candidate the run timed
and accelerated-scan (off the grid: ``--shapes offgrid --accel --served``).

Writes under --out:
  bench.json      every measurement (times in ms, fraction of copy bandwidth, compile seconds)
  defaults.json   with --ship-bench or --tune-budget: the cache exported (the shipped table
                  is built from bench.json by tools/ship_defaults.py)
(bench.md and bench.png, the tables the README shows: benchmarks/bench_report.py.)
Times: the tuner's clock (samu_tune.timing.gpu_samples, the same function samu_tune.tune's
samples go through): median GPU time of one call, L2 flushed, each sample queued behind a GPU
busy-wait so the host's launch time never shows; the host time per call is kept beside it
({mode}_host_ms).  The benchmark's fastest and the tuner's pick are so comparable by
construction.  --do-bench adds triton.testing.do_bench of the same call ({mode}_do_bench_ms).
Forward moves 4 arrays of [B, L, M] (read br, bi; write real, imag); forward+backward about 10.
Compilation is warmed first in a pool of processes (Triton's disk cache is shared), so the
timed process only loads binaries; compile seconds are recorded per task.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import triton

import samu_tune
from samu_tune import registry
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.verify import random_inputs, verify

from benchmarks.common import (GRID, OFF_GRID, add_out, copy_bandwidth_tbps, error_text, floor_ms,
                               make_call, parse_shapes, time_call, warm_all, write_json)

FP32_SHAPES = [(1, 16384, 256), (8, 8192, 1024)]
# configs measured fastest in earlier H200 runs, timed beside each strategy's default and
# sampled configs (results under scripts/results/NVIDIA-H200/ at commit b805d05: the probe_*
# files, then bench_lookback's s13b/lookback and s15/lookback*)
KNOWN_GOOD = {
    "lookback": [dict(chunk=16, block_m=128, num_warps=2), dict(chunk=128, block_m=32, num_warps=4),
                 dict(chunk=64, block_m=32, num_warps=2), dict(chunk=256, block_m=16, num_warps=4),
                 dict(chunk=32, block_m=512, num_warps=4, inner="loop"),
                 dict(chunk=32, block_m=256, num_warps=4, inner="loop"),
                 dict(chunk=32, block_m=128, num_warps=2, inner="loop"),
                 # rows per step 2 and look-back width 8 (s13b)
                 dict(chunk=64, block_m=512, num_warps=4, inner="loop", rows=2),
                 dict(chunk=64, block_m=256, num_warps=2, inner="loop", rows=2),
                 dict(chunk=32, block_m=256, num_warps=4, inner="loop", rows=2),
                 dict(chunk=32, block_m=128, num_warps=2, inner="loop", rows=2),
                 dict(chunk=64, block_m=32, num_warps=2, lookback_width=8),
                 # software-pipelined walks (s15)
                 dict(chunk=64, block_m=256, num_warps=2, inner="loop", rows=2, stages=4),
                 dict(chunk=64, block_m=256, num_warps=2, inner="loop", rows=2, stages=6),
                 dict(chunk=64, block_m=512, num_warps=4, inner="loop", rows=2, stages=4),
                 dict(chunk=64, block_m=256, num_warps=2, inner="loop", stages=6),
                 dict(chunk=128, block_m=256, num_warps=2, inner="loop", stages=4),
                 dict(chunk=64, block_m=128, num_warps=2, inner="loop", rows=2, stages=6),
                 dict(chunk=64, block_m=128, num_warps=2, inner="loop", lookback_width=8,
                      stages=6),
                 dict(chunk=64, block_m=256, num_warps=4, inner="loop", lookback_width=8,
                      stages=6)],
    # the read-once forward: chunks staged in shared memory (64 x 256 at 2 warps: 3 programs
    # per SM in bf16), the backward fields of lookback's fast walks
    "lookback_once": [dict(chunk=64, block_m=256, num_warps=2, inner="loop"),
                      dict(chunk=32, block_m=256, num_warps=2, inner="loop"),
                      dict(chunk=64, block_m=512, num_warps=4, inner="loop"),
                      dict(chunk=64, block_m=128, num_warps=2, inner="loop"),
                      # 16 KB staged: twice the programs an SM holds, and twice the columns
                      # between a chunk and its predecessor's ticket (an H100 timeline: the
                      # look-back wait on the predecessor is 32-48% of a program's life; 2%
                      # slower on the H100, where the forward is at DRAM's limit)
                      dict(chunk=32, block_m=128, num_warps=2, inner="loop"),
                      dict(chunk=64, block_m=256, num_warps=2, inner="loop", stages=6),
                      dict(chunk=64, block_m=256, num_warps=2, inner="loop", rows=2, stages=6),
                      # lookback's fastest 128-mode training walks (its H100 winners at
                      # (1, 2048, 1024) and (1, 16384, 256))
                      dict(chunk=64, block_m=128, num_warps=2, inner="loop", rows=2, stages=6),
                      dict(chunk=64, block_m=128, num_warps=2, inner="loop", lookback_width=8,
                           stages=6)],
    # the read-once forward and a backward that stages d out the same way
    "lookback_staged": [dict(chunk=64, block_m=128, num_warps=2, inner="loop"),
                        dict(chunk=32, block_m=256, num_warps=2, inner="loop"),
                        dict(chunk=32, block_m=128, num_warps=2, inner="loop"),
                        dict(chunk=64, block_m=256, num_warps=2, inner="loop")],
}


# ---------------------------------------------------------------- timing ----------------------

def measure(kind, name, config, shape, dtype, modes=("forward", "train"), reps_ms=200,
            do_bench=False):
    """Times (ms) of one candidate on one shape: forward and forward+backward, with the
    first call's seconds (``first_{mode}_s``) and the host time per call."""
    B, L, M = shape
    res = {}
    for mode in modes:
        problem = ScanProblem(B=B, L=L, M=M, dtype=dtype, device="cuda", backward=mode == "train")
        call = make_call(kind, name, config, problem)
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        res[f"first_{mode}_s"] = time.perf_counter() - t0
        for k, v in time_call(call, reps_ms, do_bench).items():
            res[f"{mode}_{k}"] = v
    return res


def gpu_verify(name, config, shape=(2, 300, 70), dtype="bfloat16"):
    B, L, M = shape
    p = ScanProblem(B=B, L=L, M=M, dtype=dtype, device="cuda", resets=True, initial_state=True,
                    final_state=True)
    strat = registry.get(name)
    cfg = strat.parse_config(config, p)
    return verify(lambda i: strat.run(i, cfg), random_inputs(p, seed=3), p)


# ---------------------------------------------------------------- main ------------------------

def _bw(row, shape, dtype, bw):
    for mode in ("forward", "train"):
        if f"{mode}_ms" in row:
            row[f"{mode}_bw_frac"] = floor_ms(shape, dtype, mode, bw) / row[f"{mode}_ms"]


def served_rows(cases, rows, args) -> list[dict]:
    """Per case: ``samu_tune.scan`` timed as ``cached`` mode serves it with an empty user
    cache (the shipped table's exact or nearest entry, else the rule), its choice and source,
    and its time over the fastest candidate this run timed (``{mode}_vs_best``) and
    accelerated-scan's over it (``{mode}_accel_over``)."""
    import tempfile

    from samu_tune import dispatch, explain
    from samu_tune.settings import environment, reload_settings
    out = []
    try:
        with (tempfile.TemporaryDirectory() as empty,
              environment(SAMU_TUNE_CACHE_DIR=empty, SAMU_TUNE_MODE="cached")):
            reload_settings()
            dispatch.clear_memo()
            for shape, dtype in cases:
                row = {"kind": "served", "name": "samu_tune.scan (cached)", "config": None,
                       "shape": list(shape), "dtype": dtype}
                try:
                    row.update(measure("scan", "scan", None, shape, dtype,
                                       ("forward", "train"), args.rep_ms, args.do_bench))
                    for mode in ("forward", "train"):
                        e = explain(ScanProblem(B=shape[0], L=shape[1], M=shape[2],
                                                dtype=dtype, backward=mode == "train"))
                        row[f"{mode}_choice"] = f"{e.strategy} {e.config} ({e.source})"
                        _versus(row, rows, shape, dtype, mode)
                except Exception as exc:
                    row["error"] = error_text(exc)
                out.append(row)
                print(f"served   {str(shape):18s} {dtype:8s} "
                      f"fwd {row.get('forward_ms', float('nan')):8.3f} ms "
                      f"(x{row.get('forward_vs_best', float('nan')):.3f} of the best timed, "
                      f"accel x{row.get('forward_accel_over', float('nan')):.2f}) "
                      f"train {row.get('train_ms', float('nan')):8.3f} ms "
                      f"(x{row.get('train_vs_best', float('nan')):.3f}, "
                      f"accel x{row.get('train_accel_over', float('nan')):.2f}) "
                      f"{row.get('error', '')[:80]}", flush=True)
    finally:
        reload_settings()         # the caller's environment again
        dispatch.clear_memo()
    return out


def _versus(row: dict, rows: list[dict], shape, dtype, mode: str) -> None:
    """``row``'s {mode} time over the fastest strategy candidate timed at the same shape, and
    accelerated-scan's time over ``row``'s."""
    same = [r for r in rows if r.get("shape") == list(shape) and r.get("dtype") == dtype
            and f"{mode}_ms" in r]
    best = min((r[f"{mode}_ms"] for r in same if r["kind"] == "strategy"), default=None)
    accel = next((r[f"{mode}_ms"] for r in same if r["kind"] == "accel"), None)
    ms = row.get(f"{mode}_ms")
    if ms and best:
        row[f"{mode}_vs_best"] = ms / best
    if ms and accel:
        row[f"{mode}_accel_over"] = accel / ms


def tune_and_ship(cases, rows, args, out_dir, use_tuner=True):
    """Tune each (shape, mode) (unless not ``use_tuner``); the cache entry is the faster of
    the tuner's winner and the best candidate timed by this benchmark.  Exports the cache as
    ``defaults.json``."""
    from samu_tune import cache, tune
    from samu_tune.device import device_info
    tuned = []
    for shape, dtype in cases:
        for mode in ("forward", "train"):
            B, L, M = shape
            p = ScanProblem(B=B, L=L, M=M, dtype=dtype, device="cuda")
            info = {"shape": list(shape), "dtype": dtype, "mode": mode}
            try:
                if not use_tuner:
                    raise LookupError("tuner not run (--ship-bench)")
                res = tune(p, mode, budget_s=args.tune_budget, max_configs=args.tune_max_configs)
                entry = cache.entry_from_result(res)
                info.update(tuner_winner=res.winner.name, tuner_ms=res.winner.time_ms,
                            tuner_margin=res.margin, tuner_s=res.elapsed_s,
                            failed=[f"{c.name}: {c.reason}" for c in res.failed()][:10])
            except Exception as exc:
                entry = None
                info["tuner_error"] = error_text(exc)
            timed = [r for r in rows if r["kind"] == "strategy" and r["shape"] == list(shape)
                     and r["dtype"] == dtype and f"{mode}_ms" in r]
            if timed:
                best = min(timed, key=lambda r: r[f"{mode}_ms"])
                info.update(bench_best=f"{best['name']} {best['config']}",
                            bench_ms=best[f"{mode}_ms"])
                if entry is None or best[f"{mode}_ms"] < entry.time_ms:
                    entry = cache.CacheEntry(
                        key=p.model_copy(update={"backward": mode == "train"}).key(), mode=mode,
                        strategy=best["name"], config=best["config"],
                        time_ms=best[f"{mode}_ms"],
                        source_hash=registry.get(best["name"]).source_hash,
                        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"), cpu_wall_time=False,
                        versions=dict(cache.versions()), search="bench")
            if entry is not None:
                cache.put(entry, device_info("cuda"))
                info["shipped"] = f"{entry.strategy} {entry.config} {entry.time_ms:.3f} ms"
            print(f"tune {shape} {dtype} {mode}: {info.get('shipped')} "
                  f"(tuner {info.get('tuner_winner')} {info.get('tuner_ms')}, "
                  f"bench {info.get('bench_best')} {info.get('bench_ms')})", flush=True)
            tuned.append(info)
    cache.export(out_dir / "defaults.json", device_info("cuda"))
    cache.invalidate()
    return tuned


def strategy_candidates(shape, dtype, per_strategy, names=None):
    """(name, config dict) pairs: each strategy's default plus sampled configs."""
    B, L, M = shape
    p = ScanProblem(B=B, L=L, M=M, dtype=dtype, device="cuda")
    out = []
    for strat in registry.all_strategies():
        if strat.name == "reference" or (names and strat.name not in names):
            continue
        if strat.reasons(p):
            continue
        default = strat.default_config(p)
        known = [strat.parse_config(k) for k in KNOWN_GOOD.get(strat.name, [])]
        known = [c for c in known if strat.valid is None or strat.valid(p, c)]
        picked = [default] + [c for c in known if c != default]
        configs = [c for c in strat.configs(p) if c not in picked]
        rng = random.Random(f"{strat.name}{shape}")
        picked += rng.sample(configs, min(per_strategy - 1, len(configs)))
        out += [(strat.name, c.model_dump()) for c in picked]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    add_out(ap)
    ap.add_argument("--shapes", default="grid", help="grid | offgrid | smoke | B,L,M;B,L,M")
    ap.add_argument("--configs", type=int, default=4, help="configs timed per strategy")
    ap.add_argument("--strategies", default="", help="comma list (default: all)")
    ap.add_argument("--seed", default="default,chunk32", help="seed variants, '' for none")
    ap.add_argument("--seed-only-at", default="",
                    help="B,L,M;...: seed variants other than 'default' only at these shapes "
                         "(the seed compiles each shape for 80-90 s)")
    ap.add_argument("--accel", action="store_true", help="time accelerated_scan.complex")
    ap.add_argument("--served", action="store_true",
                    help="time samu_tune.scan as cached mode serves each shape with an empty "
                         "user cache, against the best timed candidate and accelerated-scan")
    ap.add_argument("--fp32", action="store_true", help="also fp32 at two shapes")
    ap.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    ap.add_argument("--rep-ms", type=int, default=150)
    ap.add_argument("--tune-budget", type=float, default=0.0,
                    help="seconds of tuning per (shape, mode); 0 skips tuning and scan timing")
    ap.add_argument("--tune-max-configs", type=int, default=12)
    ap.add_argument("--ship-bench", action="store_true",
                    help="without tuning: cache each case's fastest timed candidate, export it "
                         "as defaults.json and time samu_tune.scan dispatching to it")
    ap.add_argument("--do-bench", action="store_true",
                    help="also time each call with triton.testing.do_bench ({mode}_do_bench_ms)")
    args = ap.parse_args(argv)
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    if args.shapes == "grid":
        shapes = GRID
    elif args.shapes == "offgrid":
        shapes = OFF_GRID
    elif args.shapes == "smoke":
        shapes = [(1, 16384, 256), (8, 8192, 1024), (32, 512, 256)]
    else:
        shapes = parse_shapes(args.shapes)
    cases = [(s, "bfloat16") for s in shapes]
    if args.fp32:
        cases += [(s, "float32") for s in FP32_SHAPES if s in shapes]
    names = [n for n in args.strategies.split(",") if n]
    seed_variants = ["seed_" + v for v in args.seed.split(",") if v]
    seed_only_at = parse_shapes(args.seed_only_at) if args.seed_only_at else []

    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "sm_count": props.multi_processor_count,
              "torch": torch.__version__, "triton": triton.__version__,
              "samu_tune": samu_tune.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    from samu_tune import cache as _cache
    from samu_tune.device import device_info as _device_info
    result["signature"] = _cache.signature_of(_device_info("cuda"))
    result["copy_tbps"] = bw = copy_bandwidth_tbps()

    def save():  # after every phase: a run stopped at its time limit keeps what it measured
        result["wall_s"] = time.time() - t_start
        write_json(out_dir / "bench.json", result)
    print(f"{props.name}: copy bandwidth {bw:.2f} TB/s", flush=True)

    # 1. correctness on the GPU of each strategy's default config (resets, h0, final, bf16)
    result["verify"] = {}
    for strat in registry.all_strategies():
        if strat.name == "reference" or (names and strat.name not in names):
            continue
        try:
            err = gpu_verify(strat.name, None)
        except Exception as exc:
            err = "raised " + error_text(exc)
        result["verify"][strat.name] = err or "ok"
        print(f"verify {strat.name}: {err or 'ok'}", flush=True)

    # 2. candidates and parallel warm-up (compile) of everything
    tasks = []
    for shape, dtype in cases:
        for name, cfg in strategy_candidates(shape, dtype, args.configs, names):
            tasks.append(("strategy", name, cfg, shape, dtype, ("forward", "train")))
        if dtype == "bfloat16":
            tasks += [("seed", v, None, shape, dtype, ("forward", "train")) for v in seed_variants
                      if v == "seed_default" or not seed_only_at or shape in seed_only_at]
    t0 = time.time()
    result["warm"] = warm_all(tasks, args.workers)
    result["warm_wall_s"] = time.time() - t0
    save()
    print(f"warm-up of {len(tasks)} tasks: {time.time() - t0:.0f}s", flush=True)
    if args.accel:
        tasks += [("accel", "accelerated_scan", None, s, d, ("forward", "train"))
                  for s, d in cases if d == "bfloat16"]

    # 3. timing, one process, one candidate at a time
    rows = []
    for task in tasks:
        kind, name, cfg, shape, dtype, modes = task
        key = json.dumps(task[:5], default=str)
        warm = result["warm"].get(key, {})
        row = {"kind": kind, "name": name, "config": cfg, "shape": list(shape), "dtype": dtype,
               "compile_s": warm.get("seconds")}
        if warm.get("error"):
            row["error"] = warm["error"]
        else:
            try:
                row.update(measure(kind, name, cfg, shape, dtype, modes, args.rep_ms,
                                   args.do_bench))
            except Exception as exc:
                row["error"] = error_text(exc)
        _bw(row, shape, dtype, bw)
        rows.append(row)
        print(f"{kind:8s} {name:18s} {str(shape):18s} {dtype:8s} "
              f"fwd {row.get('forward_ms', float('nan')):8.3f} ms "
              f"(host {row.get('forward_host_ms', float('nan')):6.3f}) "
              f"train {row.get('train_ms', float('nan')):8.3f} ms "
              f"(host {row.get('train_host_ms', float('nan')):6.3f}) "
              f"{row.get('error', '')[:80]}", flush=True)
        if len(rows) % 10 == 0:
            result["rows"] = rows
            save()
    result["rows"] = rows
    save()

    # 3b. what `cached` mode serves each case from the shipped table or the rule, with an
    #     empty user cache (before this run tunes or caches anything), beside the timed best
    if args.served:
        result["served"] = served_rows(cases, rows, args)
        rows += result["served"]
        result["rows"] = rows
        save()

    # 4. tune each case (budgeted), keep the faster of the tuner's winner and the best timed
    #    candidate above as the cache entry, export it as the shipped table, time the dispatch
    if args.tune_budget > 0 or args.ship_bench:
        result["tuned"] = tune_and_ship(cases, rows, args, out_dir,
                                        use_tuner=args.tune_budget > 0)
        save()
        for shape, dtype in cases:
            row = {"kind": "scan", "name": "samu_tune.scan", "config": None,
                   "shape": list(shape), "dtype": dtype}
            try:
                row.update(measure("scan", "scan", None, shape, dtype, ("forward", "train"),
                                   args.rep_ms, args.do_bench))
                from samu_tune import explain
                for mode in ("forward", "train"):
                    p = ScanProblem(B=shape[0], L=shape[1], M=shape[2], dtype=dtype,
                                    backward=mode == "train")
                    e = explain(p)
                    row[f"{mode}_choice"] = f"{e.strategy} {e.config} ({e.source})"
            except Exception as exc:
                row["error"] = error_text(exc)
            _bw(row, shape, dtype, bw)
            rows.append(row)
            print(f"scan     {str(shape):18s} {dtype:8s} fwd {row.get('forward_ms', float('nan')):8.3f}"
                  f" ms train {row.get('train_ms', float('nan')):8.3f} ms "
                  f"{row.get('forward_choice', '')} | {row.get('train_choice', '')}", flush=True)
    save()
    print(f"total {result['wall_s']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
