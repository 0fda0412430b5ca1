"""``samu-tune profile``: tune every shape of a shapes file, store the winners, show tables.

Per problem (a shape entry expands to the product of its B, L, M lists and, for mode
``both``, to a forward and a train problem): the served exact cache entry is reused unless
``--force``; otherwise :func:`samu_tune.tune` runs and the winner is recorded in the cache
file of the device it was measured on.  Without a CUDA GPU the problems run on the CPU (the
Triton interpreter when ``TRITON_INTERPRET=1``); those are CPU wall times, stored under the
``cpu-interpreter`` / ``cpu`` signature and never in a GPU's table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Optional

import torch

from samu_tune import cache, registry, timing
from samu_tune.device import DeviceInfo, device_info
from samu_tune import opspec
from samu_tune.problem import Problem
from samu_tune.rules import NoEligibleStrategy, rule_choice
from samu_tune.settings import settings
from samu_tune.results import TuneResult, candidate_name, config_json
from samu_tune.tuner import tune
from samu_tune.cli import bandwidth, console, render
from samu_tune.cli.console import CLIError
from samu_tune.cli.progress import ProfileProgress
from samu_tune.cli.rows import ProfileRow
from samu_tune.cli.shapes import load_shapes

# per-shape cap on a GPU: the search times the known winners of nearby shapes first (the
# shipped table and the user cache), then screens and refines until it converges (the
# settings' tune_patience) or this many seconds have passed
DEFAULT_BUDGET_S = 45.0

# --quick: a smoke run (scripts/run on the CPU): few candidates, few samples each
QUICK_MAX_CONFIGS = 4
QUICK_REPS = 3


def _strategies(text: Optional[str]) -> Optional[list[str]]:
    if not text:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = list(dict.fromkeys(s.name for op in registry.ops()
                               for s in registry.all_strategies(op)))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CLIError(f"--strategies: unknown strategy {', '.join(map(repr, unknown))}; "
                       f"registered: {', '.join(known)}")
    return names


def _device(want: str) -> str:
    if want in ("auto", "cuda") and torch.cuda.is_available():
        return "cuda"
    if want == "cuda":
        raise CLIError("--device cuda: no CUDA GPU found")
    return "cpu"


def _for_op(names: Optional[list[str]], op: str) -> Optional[list[str]]:
    """The names of ``--strategies`` that ``op`` has (all of its strategies when none)."""
    if names is None:
        return None
    mine = {s.name for s in registry.all_strategies(op)}
    return [n for n in names if n in mine] or None


def _problems(shapes, device: str, mode: Optional[str]) -> list[Problem]:
    seen, out = set(), []
    for entry in shapes.shapes:
        for p in entry.problems(device, mode):
            if p not in seen:
                seen.add(p)
                out.append(p)
    return out


def _rule(problem: Problem, dev: DeviceInfo):
    try:
        return rule_choice(problem, dev)
    except NoEligibleStrategy:
        return None


def _ratio(other: Optional[float], winner: Optional[float]) -> Optional[float]:
    return other / winner if other is not None and winner else None


def row_from_result(result: TuneResult, dev: DeviceInfo, bw: Optional[float]) -> ProfileRow:
    p, w, r = result.problem, result.winner, result.runner_up
    row = ProfileRow(
        key=p.key(), mode=p.mode, problem=p.model_dump(mode="json"),
        source="tuned" if w else "failed", evaluated=len(result.candidates),
        failed=len(result.failed()),
        skipped=sum(c.status == "skipped" for c in result.candidates),
        failures=[{"candidate": c.name, "reason": c.reason or ""} for c in result.failed()],
        ineligible=result.ineligible, stopped=result.stopped, elapsed_s=result.elapsed_s)
    if w is None:
        return row
    row.winner, row.strategy, row.config, row.time_ms = w.name, w.strategy, w.config, w.time_ms
    if r is not None:
        row.runner_up, row.runner_up_ms = r.name, r.time_ms
        row.speedup_vs_runner_up = _ratio(r.time_ms, w.time_ms)
    rule = _rule(p, dev)
    if rule is not None:
        cfg = config_json(rule.config)
        row.rule_default = candidate_name(rule.strategy.name, cfg)
        for c in result.candidates:
            if c.status == "ok" and c.strategy == rule.strategy.name and c.config == cfg:
                row.rule_default_ms = c.time_ms
                row.speedup_vs_rule_default = _ratio(c.time_ms, w.time_ms)
    row.copy_bw_fraction = bandwidth.fraction(p, w.time_ms, bw)
    return row


def row_from_cache(problem: Problem, entry: cache.CacheEntry, dev: DeviceInfo,
                   bw: Optional[float]) -> ProfileRow:
    row = ProfileRow(key=problem.key(), mode=problem.mode, problem=problem.model_dump(mode="json"),
                     source="cached", winner=candidate_name(entry.strategy, entry.config),
                     strategy=entry.strategy, config=entry.config, time_ms=entry.time_ms,
                     copy_bw_fraction=bandwidth.fraction(problem, entry.time_ms, bw))
    if entry.runner_up is not None:
        row.runner_up = candidate_name(entry.runner_up.strategy, entry.runner_up.config)
        row.runner_up_ms = entry.runner_up.time_ms
        row.speedup_vs_runner_up = _ratio(entry.runner_up.time_ms, entry.time_ms)
    rule = _rule(problem, dev)
    if rule is not None:
        row.rule_default = candidate_name(rule.strategy.name, config_json(rule.config))
    return row


def _summary(row: ProfileRow) -> str:
    if row.time_ms is None:
        return f"no winner ({row.failed} failed)"
    where = "from the cache" if row.source == "cached" else \
        f"{row.evaluated} candidate(s), {row.failed} failed, {row.elapsed_s:.1f} s"
    return f"{row.winner} {row.time_ms:.4g} ms ({where})"


def _rerun_interpreted(args: argparse.Namespace) -> int:
    """Run this same command again with ``TRITON_INTERPRET=1``: Triton reads it when the
    kernels are defined (at import), so this process cannot switch to the interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.call([sys.executable, "-m", "samu_tune.cli", *args.argv], env=env)


def _compile_workers(args: argparse.Namespace, device: str) -> int:
    """The tunes' compile pool size: ``--compile-workers``, else
    ``SAMU_TUNE_COMPILE_WORKERS``, else on a GPU with the pool in compile mode
    :func:`~samu_tune.compile_pool.suggested_workers` for this host's tuning processes
    (a cold main job on an H100 host: 0.78-0.86 of its wall time without workers); the
    verify mode's pool made a cold tune slower on the H200, so it stays opt-in."""
    from samu_tune.compile_pool import suggested_workers
    if getattr(args, "compile_workers", None) is not None:
        return args.compile_workers
    s = settings()
    if s.compile_workers is not None:
        return s.compile_workers
    if device != "cuda" or s.compile_mode != "compile":
        return 0
    return suggested_workers(torch.device("cuda"), s.world_size)


def _distributed(device: str) -> tuple[int, int]:
    """(rank, world size): under ``torchrun --nproc-per-node N -m samu_tune.cli profile``
    (WORLD_SIZE > 1) the process group joined (NCCL on CUDA, gloo on the CPU) and, on CUDA,
    this rank's GPU (LOCAL_RANK) made current: each rank tunes every world-th problem of the
    shapes file on its own GPU; else (0, 1)."""
    s = settings()
    if s.world_size <= 1:
        return 0, 1
    import torch.distributed as dist
    if device == "cuda":
        torch.cuda.set_device(s.local_rank if s.local_rank is not None else 0)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _shard(problems: list, rank: int, world: int) -> list[int]:
    """The indices of ``problems`` that ``rank`` of ``world`` tunes: shapes dealt round robin,
    a shape's forward and train problems to the same rank (in the file's order), so that its
    train tune finds the forward winner in the rank's cache."""
    group: dict = {}
    out = []
    for i, p in enumerate(problems):
        shape = p.model_copy(update={"backward": False}) if hasattr(p, "backward") else p
        g = group.setdefault(shape.key(), len(group))
        if g % world == rank:
            out.append(i)
    return out


def _merge_ranks(rows_at: dict[int, ProfileRow], results: list[tuple[int, TuneResult]]
                 ) -> dict[int, ProfileRow]:
    """Every rank's rows and tune results gathered on every rank; each rank stores all the
    winners in its cache (one file on one host: the same entries written under its lock;
    one per host otherwise), so every rank then serves the same decisions.  Returns the rows
    of all ranks by problem index."""
    import torch.distributed as dist
    mine = ([(i, r.model_dump(mode="json")) for i, r in rows_at.items()],
            [(res.problem.op, res.problem.model_dump(mode="json"), res.model_dump_json())
             for _, res in results])
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    merged: dict[int, ProfileRow] = {}
    for rows, tuned in everyone:
        for i, row in rows:
            merged[i] = ProfileRow.model_validate(row)
        for op, problem, text in tuned:   # the problem parsed as its op's type
            cache.record(TuneResult.model_validate_json(text).model_copy(
                update={"problem": opspec.get(op).problem_type.model_validate(problem)}))
    dist.barrier()
    cache.invalidate()
    return merged


def run(args: argparse.Namespace) -> int:
    shapes = load_shapes(args.shapes)
    names = _strategies(args.strategies)
    device = _device(args.device)
    if (device == "cpu" and not settings().interpret and not settings().interpret_set
            and getattr(args, "argv", None) is not None):
        note = console.err() if args.json else console.out()
        note.print("No CUDA GPU found: re-running with TRITON_INTERPRET=1 so the Triton "
                   "strategies run on the CPU interpreter (TRITON_INTERPRET=0: torch only).",
                   markup=False)
        return _rerun_interpreted(args)
    problems = _problems(shapes, device, args.mode)
    dev = device_info("cuda" if device == "cuda" else "cpu")
    sig = dev.signature()
    out = console.out()
    note = console.err() if args.json else out
    if device == "cpu":
        why = "No CUDA GPU found" if args.device == "auto" else "--device cpu"
        note.print(f"{why}: profiling {len(problems)} problem(s) of {args.shapes} on the CPU "
                   f"(CPU wall times, stored as '{sig}', never in a GPU's table).", markup=False)
        if not settings().interpret:
            note.print("TRITON_INTERPRET is off: only the torch reference runs on the CPU.")
    max_configs = args.max_configs
    reps = None
    if args.quick:
        max_configs = min(max_configs or QUICK_MAX_CONFIGS, QUICK_MAX_CONFIGS)
        reps = QUICK_REPS if device == "cpu" else None   # GPU samples are cheap
    bw = timing.copy_bandwidth(torch.cuda.current_device()) if device == "cuda" else None

    rank, world = _distributed(device)
    mine = [(i, problems[i]) for i in _shard(problems, rank, world)]
    workers = _compile_workers(args, device)
    if workers and rank == 0 and not args.json and (args.force or any(
            cache.lookup(problem, sig) is None for _, problem in mine)):
        note.print(f"Compiling candidates ahead of timing in {workers} worker process(es) "
                   "(--compile-workers 0: none).", markup=False)
    budget = args.budget
    if budget is None and device == "cuda" and not getattr(args, "exhaustive", False):
        budget = DEFAULT_BUDGET_S
    rows_at: dict[int, ProfileRow] = {}
    results: list[tuple[int, TuneResult]] = []
    t0 = time.monotonic()
    with ProfileProgress(len(mine), verbose=args.verbose,
                         quiet=args.json or rank != 0) as progress:
        for n, (i, problem) in enumerate(mine, 1):
            progress.shape_start(n, problem.key())
            entry = None if args.force else cache.lookup(problem, sig)
            if entry is not None:
                row = row_from_cache(problem, entry, dev, bw)
            else:
                result = tune(problem, strategies=_for_op(names, problem.op),
                              budget_s=budget, exhaustive=getattr(args, "exhaustive", False),
                              max_configs=max_configs, reps=reps,
                              patience=getattr(args, "patience", None) or settings().tune_patience,
                              retime_rounds=reps, compile_workers=workers,
                              progress=progress.event)
                if result.winner is not None:
                    # recorded at once: the same shape's train tune starts from this forward
                    # winner (the tuner's priors); the ranks' merge writes the same entry again
                    cache.record(result)
                    results.append((i, result))
                row = row_from_result(result, dev, bw)
            rows_at[i] = row
            progress.shape_done(_summary(row), tuned=entry is None)
    if world > 1:
        rows_at = _merge_ranks(rows_at, results)
        if rank != 0:
            return 0 if all(r.time_ms is not None for r in rows_at.values()) else 1
    rows = [rows_at[i] for i in sorted(rows_at)]
    elapsed = time.monotonic() - t0

    if args.json:
        print(json.dumps(dict(
            signature=sig, device=dev.model_dump(mode="json"),
            timing="cuda-events" if device == "cuda" else "cpu-wall",
            cpu_timings=device == "cpu", copy_bandwidth_bytes_per_s=bw,
            cache_file=str(cache.path(sig)), elapsed_s=elapsed,
            results=[r.model_dump(mode="json") for r in rows]), indent=1))
    else:
        for table in render.profile_tables(rows, sig, cpu=device == "cpu", bandwidth=bw):
            console.print_table(out, table)
        out.print(render.LEGEND)
        for line in render.failure_lines(rows):
            out.print(line)
        tuned = sum(r.source == "tuned" for r in rows)
        cached = sum(r.source == "cached" for r in rows)
        out.print(f"{tuned} tuned, {cached} from the cache"
                  + ("" if args.force or not cached else " (--force re-tunes them)")
                  + f", {len(rows) - tuned - cached} without a winner in {elapsed:.1f} s; "
                  f"winners stored in {cache.path(sig)}", markup=False)
        if device == "cpu":
            out.print("CPU wall times measure the Triton interpreter (kernels run in Python), "
                      "not GPU speed.")
        if args.show_defaults:
            from samu_tune.cli import show
            show.print_defaults(out)
    return 0 if all(r.time_ms is not None for r in rows) else 1
