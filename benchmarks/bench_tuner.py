"""The tuner measured: how long a tune takes on a warm compile cache, and how
close its pick gets to an exhaustive search, timed with the tuner's own clock.

Per case (shape, mode):
  (a) ``samu_tune.tune(problem, mode, budget_s=<settings default>, patience=<settings
      default>)``, the search online mode and ``profile`` run: wall seconds, with the part
      spent in first calls (``warmup_s``: loading or compiling kernels) and verification;
  (b) exhaustive reference: every valid ``lookback`` config with decoupled look-back, sub=1,
      window=1 (the subspace the H200 winners come from) plus every other strategy's default,
      each timed with :func:`samu_tune.timing.gpu_samples` (GPU time, as the tuner);
  (c) the pick, the exhaustive top three and the shipped table's choice re-timed interleaved
      (round robin, one sample each per round): ``ratio = pick / best of the exhaustive``
      (target <= 1.03).

Before each case, a pool of processes compiles (Triton's disk cache is shared) each
strategy's default and one-field neighbours (what the tuner's first search pass reaches), then
the case's exhaustive candidates, at the case's shape and at the tuner's verification shape,
for at most --warm-share of the case's share of the time left; before the first, a throwaway
tune of a small problem pays the process's one-time costs: the tune of (a) is so measured on a
warm disk cache, as a process that dispatches an untuned shape sees it.  A candidate the pool
did not reach compiles inside the tune; ``cold`` counts those (first call over 1 s).  The
pool's tasks left over compile after the tune, in parallel, before the exhaustive timing
(compiled one by one inside it, 68 configs took 152 s on an H100 host).  Each case's
exhaustive timing ends with the case's share of the time left (in a 330 s H100 run of four
cases without it, the second case timed 8 of 188 configs and the last two none); a set cut
short is marked: its ratio is against the best of the configs timed.

Output under --out: bench_tuner.json (saved after every step) and bench_tuner.md.  Every
failure is recorded and the run goes on; --time-limit bounds the whole run (the compile pool
gets --warm-share of it, each tune's budget is clipped to what is left).

    python -m benchmarks.bench_tuner --out DIR --time-limit 225
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import time
import traceback
from typing import Optional

import torch

import samu_tune
from samu_tune import registry, timing
from samu_tune.device import device_info
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.settings import settings
from samu_tune.ops.scan.spec import verification_problem
from samu_tune.results import candidate_name, config_json
from samu_tune.tuner import _priors
from samu_tune.ops.scan.verify import verify_strategy

from benchmarks.common import (add_out, error_text, make_call, parse_shape, spawn_pool,
                               time_call, write_json)

# off the benchmark grid (the shipped table holds the grid shapes: its winners are priors here),
# four shapes in both modes
CASES = ("16,2048,512:forward;16,2048,512:train;4,16384,256:forward;4,16384,256:train;"
         "2,32768,128:forward;2,32768,128:train;3,5000,300:forward;3,5000,300:train")
COLD_S = 1.0   # a first call slower than this compiled (a disk-cache load takes ~0.1 s)


def parse_cases(text: str, dtype: str, device: str) -> list[ScanProblem]:
    out = []
    for item in text.split(";"):
        shape, _, mode = item.strip().partition(":")
        B, L, M = parse_shape(shape)
        out.append(ScanProblem(B=B, L=L, M=M, dtype=dtype, device=device,
                               backward=(mode or "forward") == "train"))
    return out


def _eligible(problem: ScanProblem):
    """Strategies the tuner would try (the torch reference left out)."""
    return [s for s, reasons in registry.eligible(problem) if not reasons
            and s.name != "reference"]


def exhaustive_set(problem: ScanProblem) -> list[tuple[str, dict]]:
    """The decoupled, sub=1, window=1 lookback subspace plus every other strategy's default."""
    out = []
    for strat in _eligible(problem):
        if strat.name == "lookback":
            out += [(strat.name, config_json(c)) for c in strat.configs(problem)
                    if c.lookback == "decoupled" and c.sub == 1 and c.window == 1]
            default = config_json(strat.default_config(problem))
            if (strat.name, default) not in out:
                out.append((strat.name, default))
        else:
            out.append((strat.name, config_json(strat.default_config(problem))))
    return out


def neighbour_set(problem: ScanProblem) -> list[tuple[str, dict]]:
    """The tuner's first pass: each strategy's default and the priors (winners of neighbouring
    tuned problems, here from the shipped table), with their valid configs one field away."""
    eligible = _eligible(problem)
    space = {s.name: s.configs(problem) for s in eligible}
    starts = [(s, s.default_config(problem)) for s in eligible]
    starts += _priors(problem, device_info(torch.device(problem.device)), eligible, space, 3)
    out = []
    for strat, start in starts:
        fields = list(strat.config_model.model_fields)
        for cfg in space[strat.name]:
            differ = [f for f in fields if getattr(cfg, f) != getattr(start, f)]
            item = (strat.name, config_json(cfg))
            if len(differ) <= 1 and item not in out:
                out.append(item)
    return out


# ---------------------------------------------------------------- compile pool ---------------

def _warm(task):
    """Compile one candidate as the tuner runs it: verification at its small problem (the same
    function, inputs and seed), then one timed-path call at the real shape."""
    name, cfg, key, device = task
    t0 = time.perf_counter()
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
        problem = ScanProblem.from_key(key, device=device)
        strat = registry.get(name)
        config = strat.parse_config(cfg)
        vproblem = verification_problem(problem, strat, config, device_info(torch.device(device)))
        verify_strategy(strat, config, vproblem, seed=0, device=device)
        make_call("strategy", name, cfg, problem, device)()
        timing.sync(torch.device(device))
        return task, time.perf_counter() - t0, None
    except Exception as exc:  # recorded, the run goes on
        return task, time.perf_counter() - t0, error_text(exc, 300)


def warm_in(pool, tasks, deadline: float) -> dict:
    """Run ``tasks`` in ``pool`` until done or ``deadline``: pending ones are cancelled (kept
    in the result's ``left``, in order) and the running ones finish, and are counted, before
    this returns (left running, they would share the GPU and the CPUs with the tune being
    measured)."""
    out = _warm_stats(len(tasks))
    out["left"] = list(tasks) if pool is None else []
    if pool is None or not tasks:
        return out
    try:
        futures = [pool.submit(_warm, t) for t in tasks]
        cf.wait(futures, timeout=max(1.0, deadline - time.monotonic()),
                return_when=cf.ALL_COMPLETED)
    except Exception as exc:  # a broken pool: the cases compile in-process instead
        out["errors"].append("pool: " + error_text(exc, 294))
        out["left"] = list(tasks)
        out["cancelled"] = len(tasks)
        return out
    out["left"] = [t for t, f in zip(tasks, futures) if f.cancel()]
    out["cancelled"] = len(out["left"])
    cf.wait([f for f in futures if not f.cancelled()])
    for fut in futures:
        if fut.cancelled():
            continue
        try:
            task, secs, err = fut.result()
        except Exception as exc:  # a worker that died: its task counts as an error
            out["errors"].append("pool: " + error_text(exc, 294))
            continue
        out["done"] += 1
        out["seconds"] += secs
        if err:
            out["errors"].append(f"{candidate_name(task[0], task[1])} {task[2]}: {err}")
    return out


def _warm_stats(tasks: int = 0) -> dict:
    """Compile-pool counts: tasks, done, errors, worker seconds, cancelled."""
    return {"tasks": tasks, "done": 0, "errors": [], "seconds": 0.0, "cancelled": 0}


def _add_warm(total: dict, part: dict) -> None:
    for k in ("tasks", "done", "seconds", "cancelled"):
        total[k] += part[k]
    total["errors"] += part["errors"]


def _merge_warm(before: dict, after: dict) -> dict:
    """One case's pool counts from its two passes (before the tune; after it, those of the
    tasks the first pass cancelled that the exhaustive timing needs): a task submitted twice
    counts once, cancelled or done as the second pass left it."""
    out = dict(before, errors=list(before["errors"]), left=after.get("left", []))
    _add_warm(out, _second_pass(after))
    return out


def _second_pass(after: dict) -> dict:
    """A second pass's counts as an addition to the first's: no new tasks, and the tasks it
    re-ran no longer cancelled."""
    return dict(after, tasks=0, cancelled=after["cancelled"] - after["tasks"])


# ---------------------------------------------------------------- one case -------------------

def tune_case(problem: ScanProblem, budget_s: float, patience: Optional[int]) -> dict:
    """The tune as online mode and ``profile`` run it: ``budget_s`` and the patience stop
    (None: none, the search then runs to its budget)."""
    t0 = time.monotonic()
    res = samu_tune.tune(problem, problem.mode, budget_s=budget_s, patience=patience)
    wall = time.monotonic() - t0
    cands = res.candidates
    info = {"wall_s": wall, "budget_s": budget_s, "patience": patience, "stopped": res.stopped,
            "evaluated": len([c for c in cands if c.status != "skipped"]),
            "failed": [f"{c.name}: {c.reason}" for c in res.failed()][:10],
            "warmup_s": sum(c.warmup_s for c in cands), "verify_s": sum(c.verify_s for c in cands),
            "cold": sum(c.warmup_s > COLD_S for c in cands),
            "candidates": [dict(name=c.name, phase=c.phase, status=c.status, time_ms=c.time_ms,
                                host_ms=c.host_ms, warmup_s=round(c.warmup_s, 3),
                                verify_s=round(c.verify_s, 3), wall_s=round(c.wall_s, 3))
                           for c in cands]}
    if res.winner is not None:
        w = res.winner
        info.update(pick=w.name, pick_strategy=w.strategy, pick_config=w.config,
                    pick_ms=w.time_ms, pick_host_ms=w.host_ms, margin=res.margin,
                    pick_phase=w.phase)
    return info


def exhaustive_case(problem, cands, args, deadline, device) -> list[dict]:
    rows = []
    for name, cfg in cands:
        row = {"name": candidate_name(name, cfg), "strategy": name, "config": cfg}
        if time.monotonic() > deadline:
            row["error"] = "not timed: --time-limit"
            rows.append(row)
            continue
        try:
            call = make_call("strategy", name, cfg, problem, device)
            t0 = time.perf_counter()
            call()
            timing.sync(torch.device(device))
            row["first_s"] = time.perf_counter() - t0
            row.update(time_call(call, args.reps_ms, device=device))
        except Exception as exc:
            row["error"] = error_text(exc, 300)
        rows.append(row)
    ok = [r for r in rows if "ms" in r]
    for r in sorted(ok, key=lambda r: r["ms"])[:3]:   # the exhaustive winners must be right
        try:
            strat = registry.get(r["strategy"])
            cfg = strat.parse_config(r["config"])
            vp = verification_problem(problem, strat, cfg, device_info(torch.device(device)))
            r["verify"] = verify_strategy(strat, cfg, vp, seed=0, device=device) or "ok"
        except Exception as exc:
            r["verify"] = "raised " + error_text(exc, 293)
    return rows


def retime(problem, entries: dict[str, tuple[str, dict]], rounds: int, device) -> dict:
    """Interleaved re-timing: per round one sample of each entry; medians (ms)."""
    calls, hosts, samples, errors = {}, {}, {}, {}
    for label, (name, cfg) in entries.items():
        try:
            calls[label] = make_call("strategy", name, cfg, problem, device)
            calls[label]()
            hosts[label], samples[label] = [], []
        except Exception as exc:
            errors[label] = error_text(exc, 300)
    dev = torch.device(device)
    for _ in range(rounds):
        for label, call in calls.items():
            if label in errors:
                continue
            try:
                if dev.type == "cuda":
                    samples[label] += timing.gpu_samples(
                        call, 1, timing.gpu_for(dev), hosts[label])
                else:
                    samples[label].append(time_call(call, 0.0, device=device)["ms"])
            except Exception as exc:
                errors[label] = error_text(exc, 300)
    out = {}
    for label, (name, cfg) in entries.items():
        out[label] = {"name": candidate_name(name, cfg)}
        if label in errors:
            out[label]["error"] = errors[label]
        elif samples.get(label):
            out[label].update(ms=timing.median(samples[label]), samples=len(samples[label]),
                              host_ms=timing.median(hosts[label]) if hosts[label] else None)
    return out


def shipped_choice(problem: ScanProblem):
    """(strategy, config, source) that dispatch would run (shipped table, cache or rule)."""
    try:
        e = samu_tune.explain(problem)
    except Exception:
        return None
    if e.strategy is None:
        return None
    return e.strategy, dict(e.config or {}), e.source


def run_case(problem, args, deadline, device, cases_left, pool=None, pending=()) -> dict:
    """Tune ``problem``, time its exhaustive set, re-time the pick beside the exhaustive top
    three and the shipped choice.  ``pending``: compile tasks of this case the pool has not run
    (it compiled the tuner's first pass first): those of the exhaustive set run in ``pool``
    after the tune, in parallel, instead of compiling one by one inside the exhaustive
    timing."""
    case = {"key": problem.key(), "mode": problem.mode}
    now = time.monotonic()
    share = (deadline - now) / cases_left
    # the end of this case's share of the time left: an exhaustive set that outlasts it is
    # cut (marked partial) rather than leaving the cases after it no time at all
    share_end = min(deadline, now + share)
    reserve = args.reserve_s                       # for (b) and (c) of this case
    budget = min(args.budget, max(5.0, share - reserve))
    case["budget_clipped"] = budget < args.budget
    try:
        case["tune"] = tune_case(problem, budget, args.patience or None)
    except Exception as exc:
        case["tune"] = {"error": error_text(exc),
                        "trace": traceback.format_exc()[-1500:]}
    print(f"[{problem.key()}] tune {case['tune'].get('wall_s', float('nan')):.1f}s: "
          f"{case['tune'].get('pick')} {case['tune'].get('pick_ms')} ms "
          f"(cold {case['tune'].get('cold')}, first calls {case['tune'].get('warmup_s', 0):.1f}s,"
          f" verify {case['tune'].get('verify_s', 0):.1f}s) {case['tune'].get('error', '')}",
          flush=True)
    cands = exhaustive_set(problem)
    if args.max_exhaustive:
        cands = cands[:args.max_exhaustive]
    t0 = time.monotonic()
    # the exhaustive timing needs about a tenth of a second a config once compiled
    wanted = {json.dumps([n, c], sort_keys=True) for n, c in cands}
    pending = [t for t in pending if json.dumps([t[0], t[1]], sort_keys=True) in wanted]
    case["warm_after"] = (warm_in(pool, pending, share_end - 5.0 - 0.15 * len(cands))
                          if pending else _warm_stats())
    t1 = time.monotonic()
    rows = exhaustive_case(problem, cands, args, share_end - 5.0, device)
    case["exhaustive"] = {"wall_s": time.monotonic() - t1, "compile_wall_s": t1 - t0,
                          "rows": rows, "timed": sum("ms" in r for r in rows)}
    ok = sorted((r for r in rows if "ms" in r and r.get("verify", "ok") == "ok"),
                key=lambda r: r["ms"])
    if ok:
        case["exhaustive"]["best"] = ok[0]["name"]
        case["exhaustive"]["best_ms"] = ok[0]["ms"]
    print(f"[{problem.key()}] exhaustive {case['exhaustive']['timed']}/{len(rows)} configs "
          f"timed, {t1 - t0:.1f}s compiling, {case['exhaustive']['wall_s']:.1f}s: best {case['exhaustive'].get('best')} "
          f"{case['exhaustive'].get('best_ms')} ms", flush=True)
    entries = {f"exhaustive#{i + 1}": (r["strategy"], r["config"]) for i, r in enumerate(ok[:3])}
    if case["tune"].get("pick_strategy"):
        entries["pick"] = (case["tune"]["pick_strategy"], case["tune"]["pick_config"])
    shipped = shipped_choice(problem)
    if shipped is not None and shipped[0] != "reference":
        entries["shipped"] = shipped[:2]
        case["shipped"] = f"{candidate_name(*shipped[:2])} ({shipped[2]})"
    if len(entries) >= 2 and time.monotonic() < deadline:
        rt = retime(problem, entries, args.retime_rounds, device)
        case["retime"] = rt
        best = [v["ms"] for k, v in rt.items() if k.startswith("exhaustive") and "ms" in v]
        if best and "ms" in rt.get("pick", {}):
            case["ratio"] = rt["pick"]["ms"] / min(best)
        if best and "ms" in rt.get("shipped", {}):
            case["shipped_ratio"] = rt["shipped"]["ms"] / min(best)
    print(f"[{problem.key()}] pick / exhaustive best = {case.get('ratio')} "
          f"(shipped {case.get('shipped_ratio')})", flush=True)
    return case


# ---------------------------------------------------------------- report ---------------------

def _f(x, fmt=".3f"):
    return "-" if x is None else format(x, fmt)


def markdown(result: dict) -> str:
    lines = [f"# Tuner vs exhaustive ({result.get('device')}, {result.get('started')})", "",
             "GPU time of one call (samu_tune.timing: L2 flushed, queued behind a busy-wait); "
             "host = host time per call.  ratio = pick / best of the exhaustive set, both "
             "re-timed interleaved (target <= 1.03).", "",
             "| case | tune s (budget) | evaluated | cold | first calls s | verify s | pick | "
             "pick ms | host ms | exhaustive timed | exhaustive best | best ms | ratio | "
             "shipped ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result.get("cases", []):
        t, rt = c.get("tune", {}), c.get("retime", {})
        best = min((v for k, v in rt.items() if k.startswith("exhaustive") and "ms" in v),
                   key=lambda v: v["ms"], default={})
        ex = c.get("exhaustive", {})
        n_ex = len(ex.get("rows", []))
        partial = ex.get("timed", n_ex) < n_ex
        mark = " (partial)" if partial and c.get("ratio") is not None else ""
        lines.append(
            f"| {c['key']} | {_f(t.get('wall_s'), '.1f')} ({_f(t.get('budget_s'), '.0f')}"
            f"{', ' + t['stopped'] if t.get('stopped') else ''}) | "
            f"{t.get('evaluated', '-')} | {t.get('cold', '-')} | {_f(t.get('warmup_s'), '.1f')} |"
            f" {_f(t.get('verify_s'), '.1f')} | {t.get('pick', t.get('error', '-'))}"
            f"{' (' + t['pick_phase'] + ')' if t.get('pick_phase') else ''} | "
            f"{_f(rt.get('pick', {}).get('ms'))} | {_f(rt.get('pick', {}).get('host_ms'))} | "
            f"{ex.get('timed', '-')}/{n_ex} | {best.get('name', '-')} | {_f(best.get('ms'))} | "
            f"{_f(c.get('ratio'))}{mark} | {_f(c.get('shipped_ratio'))}{mark} |")
    w = result.get("warm", {})
    if any(len(c.get("exhaustive", {}).get("rows", [])) > c.get("exhaustive", {}).get("timed", 0)
           for c in result.get("cases", [])):
        lines += ["", "(partial): the case's share of --time-limit ended the exhaustive timing "
                  "before every config was timed; the ratio is against the best of those timed "
                  "(a lower bound)."]
    lines += ["", f"Compile pool: {w.get('done', 0)}/{w.get('tasks', 0)} tasks in "
              f"{_f(result.get('warm_wall_s'), '.0f')} s ({w.get('cancelled', 0)} cancelled, "
              f"{len(w.get('errors', []))} errors).  Sleep calibration: "
              f"{_f(result.get('cycles_per_ms'), '.4g')} cycles/ms.  Late samples: "
              f"{result.get('late_samples', '-')}.  Total {_f(result.get('wall_s'), '.0f')} s."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out(ap, "bench_tuner_out")
    ap.add_argument("--cases", default=CASES, help="B,L,M:mode;... (mode forward | train)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    ap.add_argument("--time-limit", type=float, default=225.0, help="seconds for the whole run")
    ap.add_argument("--warm-share", type=float, default=0.45,
                    help="fraction of --time-limit the compile pool may use")
    ap.add_argument("--workers", type=int, default=min(15, max(1, (os.cpu_count() or 2) - 1)),
                    help="compile processes (0: no pool)")
    ap.add_argument("--no-neighbours", action="store_true",
                    help="compile only the exhaustive sets, not the defaults' neighbours")
    ap.add_argument("--budget", type=float, default=settings().tune_budget_s,
                    help="tune budget_s (default: the online-tuning default)")
    ap.add_argument("--patience", type=int, default=settings().tune_patience,
                    help="the tune's patience stop, as online mode and profile use it (default "
                         "the settings'; 0: none, each tune runs to its budget)")
    ap.add_argument("--reserve-s", type=float, default=12.0,
                    help="seconds kept per case for the exhaustive timing and re-timing")
    ap.add_argument("--reps-ms", type=float, default=40.0, help="sampling target per config")
    ap.add_argument("--retime-rounds", type=int, default=30)
    ap.add_argument("--max-exhaustive", type=int, default=0, help="cap (0: all; smoke runs)")
    ap.add_argument("--pre-tune", default="2,256,64",
                    help="B,L,M of the throwaway tune that pays one-time costs ('' skips)")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.time_limit
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    device = args.device
    problems = parse_cases(args.cases, args.dtype, device)

    result = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args),
              "torch": torch.__version__, "samu_tune": samu_tune.__version__, "cases": []}

    def save():
        result["wall_s"] = time.monotonic() - t_start
        if device == "cuda":
            result["late_samples"] = sum(g.late for g in timing._GPUS.values())
        write_json(out_dir / "bench_tuner.json", result)
        (out_dir / "bench_tuner.md").write_text(markdown(result))

    if device == "cuda":
        result["device"] = torch.cuda.get_device_name(0)
        result["signature"] = device_info(torch.device("cuda", 0)).signature()
        result["cycles_per_ms"] = timing.gpu_for(torch.device("cuda", 0)).cycles_per_ms
    else:
        result["device"] = "cpu"
    save()

    # 1. each case's compile tasks: the tuner's first pass first (what the tune reaches), then
    # the exhaustive set; compiled case by case (below), so a run cut short by --time-limit
    # still measures its first cases on a warm cache, and what the pool has not reached before
    # the tune compiles in it after the tune, before the exhaustive timing
    per_case, seen = [], set()
    groups = ([] if args.no_neighbours else [neighbour_set]) + [exhaustive_set]
    for p in problems:
        tasks = []
        for group in groups:
            for name, cfg in group(p):
                task = (name, cfg, p.key(), device)
                ident = json.dumps(task[:3], sort_keys=True)
                if ident not in seen:
                    seen.add(ident)
                    tasks.append(task)
        per_case.append(tasks)
    pool = spawn_pool(args.workers) if args.workers >= 1 else None
    result["warm"] = _warm_stats()
    result["warm_wall_s"] = 0.0

    # 2. a throwaway tune: the process's one-time costs are not charged to the first case
    if args.pre_tune:
        B, L, M = (int(x) for x in args.pre_tune.split(","))
        t0 = time.monotonic()
        try:
            samu_tune.tune(ScanProblem(B=B, L=L, M=M, dtype=args.dtype, device=device),
                           "forward", budget_s=10.0, max_configs=6)
            result["pre_tune_s"] = time.monotonic() - t0
        except Exception as exc:
            result["pre_tune_error"] = error_text(exc, 300)
        save()

    # 3. the cases, each after its compile tasks (--warm-share of its share of the time)
    for i, p in enumerate(problems):
        if time.monotonic() > deadline - 10.0:
            result["cases"].append({"key": p.key(), "skipped": "--time-limit"})
            continue
        t0 = time.monotonic()
        share = (deadline - t0) / (len(problems) - i)
        warm = warm_in(pool, per_case[i], t0 + args.warm_share * share)
        _add_warm(result["warm"], warm)
        result["warm_wall_s"] += time.monotonic() - t0
        print(f"[{p.key()}] compile pool: {warm['done']}/{warm['tasks']} in "
              f"{time.monotonic() - t0:.0f}s ({len(warm['errors'])} errors)", flush=True)
        try:
            case = run_case(p, args, deadline, device, len(problems) - i, pool, warm["left"])
        except Exception as exc:
            case = {"key": p.key(), "error": error_text(exc),
                    "trace": traceback.format_exc()[-1500:]}
        after = case.pop("warm_after", None)
        if after is not None:      # the second pass re-ran some of the first's cancelled
            _add_warm(result["warm"], _second_pass(after))
            warm = _merge_warm(warm, after)
        case["warm"] = {k: v for k, v in warm.items() if k not in ("errors", "left")}
        result["cases"].append(case)
        save()
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    save()
    print(markdown(result), flush=True)


if __name__ == "__main__":
    main()
