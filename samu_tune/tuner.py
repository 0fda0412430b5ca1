"""The tuner: eligible (strategy, config) candidates -> verify -> time -> :class:`TuneResult`.

Pipeline of :func:`tune`:

1. **Eligibility.**  Every registered strategy's capability is checked against the problem
   and device first (no compile happens for an ineligible one); its reasons are kept in
   ``TuneResult.ineligible``.  In deterministic mode (``problem.deterministic``, set when
   ``torch.are_deterministic_algorithms_enabled()``) strategies using float atomics drop out
   here.  The config space of each eligible strategy is ``Strategy.configs(problem)``.
2. **Verification.**  Each candidate is run once on random inputs and compared, forward and
   (in train mode) every gradient, with the float64 reference (:func:`samu_tune.ops.scan.verify.verify`).
   *Choice:* verification runs on a small problem with the same features and dtypes, not on the
   real shape -- the float64 reference is a Python loop over L and would dominate tuning time
   at real shapes, while kernels take B, L, M as runtime values so the compiled binary is the
   same.  The small problem keeps ``B <= 2``; ``L`` is kept when ``<= 320`` else becomes
   ``256 + L % 64`` (same tail modulo every chunk size up to 64); ``M`` is kept when ``<= 64``
   else becomes ``64`` when ``M % 32 == 0``, else ``32 + M % 32`` (same tail modulo 32).  When
   the candidate's config is not valid for (or its strategy not eligible at) that shape, the
   real M, then the real L, then the real shape are used instead.  The timing run at the real
   shape also checks that the outputs are finite.
3. **Timing** at the real shape (:mod:`samu_tune.timing`): one warm-up call (it pays the
   compile, reported as ``warmup_s``), then the median of repeated samples on a pool of fresh
   inputs -- on CUDA the GPU time alone (device events with the L2 flushed, each sample queued
   behind a GPU busy-wait so the host's launch time never shows; the host time per call is
   kept as ``host_ms``), wall time on the CPU (marked ``cpu_wall_time``).  Train mode times
   forward + backward of every input.
4. **Search.**  Not every config is timed.  First the *priors*: the winners of the nearest
   tuned problems with the prior features (``ScanProblem.prior_features``: the same features,
   narrow, long or neither; user cache, then the shipped table of this device,
   nearest in log-space of (B*M, L) first; for a train problem the winner and runner-up of
   the same shape's forward entry right after its own entry; at most ``prior_top`` distinct
   candidates that can run this problem) -- what was fast at a neighbouring shape is the best
   first guess, and it is timed before anything else in case the budget runs out (on a cold
   compile cache the screening alone can exceed a few seconds).  Then each eligible
   strategy's default config is screened, then the best ``refine_top`` strategies are
   refined by coordinate descent (one config field at a time, from the strategy's best
   config so far, until no field improves).  ``budget_s`` stops starting new candidates once
   exceeded, ``max_configs`` caps how many are evaluated; ``exhaustive=True`` evaluates the
   whole space instead (to measure how close the search gets).
5. **Re-timing.**  The best ``retime_top`` candidates are re-timed interleaved (round robin)
   and their final time is the median of those samples; the winner is the fastest and
   ``margin`` is ``runner_up.time_ms / winner.time_ms - 1``.

Ops.  The pipeline is the same for every op (:mod:`samu_tune.opspec`): the problem's op names
its strategies (``registry.eligible``) and its :class:`~samu_tune.opspec.OpSpec` gives the
random inputs, the float64 reference and the comparison, the verification problem (the scan's
is described in 2.; the decode step's keeps B <= 2) and the timed call (the decode step is
forward only).  ``mode`` and determinism apply to ops whose problem has those fields.

A candidate that fails to compile, runs out of resources or memory, raises, or disagrees with
the reference is recorded with status ``failed`` and its reason, never wins, and tuning goes on.
Caveat on CUDA: an illegal memory access poisons the CUDA context, so every later candidate
then fails too; the reason names the first failure.
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Literal, Optional, Sequence

import torch
from pydantic import BaseModel

from samu_tune import registry, timing
from samu_tune.device import DeviceInfo, device_info
from samu_tune.problem import Problem
from samu_tune.registry import Strategy
from samu_tune.evaluate import Search
from samu_tune.results import Candidate, ProgressFn, TuneResult, config_json

def _coordinate_descent(search: Search, strategy: Strategy, start: BaseModel,
                        space: list[BaseModel]) -> None:
    """Improve ``start`` one config field at a time until no field improves; then try every
    config two fields away from the best (fields interact: a look-back config two fields away
    can win where each one-field step loses, docs/performance.md) and, when one is faster,
    descend again from it.

    A field's line also holds its *repairs*: for each value of the field that no valid config
    one field away takes (the value is invalid beside the best's other fields), the valid
    configs with that value and one other field changed.  Without them such a value is
    reached only in the two-field phase, where the patience stop often ends the search first:
    the look-back's ``lookback_width`` 8 needs ``rows`` 1, and on an H100 at (2, 65536, 128)
    train the width-8 config (0.280 ms) was missed from a two-row best (0.302 ms)."""
    fields = list(strategy.config_model.model_fields)
    values = {f: {getattr(c, f) for c in space} for f in fields}
    best = start

    def time_of(cfg):
        c = search.done.get(search.key(strategy, cfg))
        return c.time_ms if c is not None and c.status == "ok" else math.inf

    def differ(cfg) -> int:
        return sum(getattr(cfg, f) != getattr(best, f) for f in fields)

    def evaluate_all(configs: list[BaseModel]) -> bool:
        todo = [c for c in configs if search.key(strategy, c) not in search.done]
        search.prefetch([(strategy, c) for c in todo])
        for i, cfg in enumerate(todo):
            left = search.left()
            total = len(todo) if left is None else min(len(todo), i + left)
            if search.evaluate(strategy, cfg, "refine", i + 1, max(total, i + 1)) is None:
                return False
        return True

    while True:
        improved = True
        while improved:
            improved = False
            for field in fields:
                others = [f for f in fields if f != field]
                line = [c for c in space
                        if all(getattr(c, f) == getattr(best, f) for f in others)]
                # repairs: a value no config of the line takes, with one more field changed
                unreached = values[field] - {getattr(c, field) for c in line}
                unreached.discard(getattr(best, field))
                line += [c for c in space if getattr(c, field) in unreached and differ(c) == 2]
                if not evaluate_all([c for c in line if c != best]):
                    return
                new_best = min(line, key=time_of, default=best)
                if time_of(new_best) < time_of(best):
                    best, improved = new_best, True
        pairs = [c for c in space if differ(c) == 2]
        if not evaluate_all(pairs):
            return
        new_best = min(pairs, key=time_of, default=best)
        if not time_of(new_best) < time_of(best):
            return
        best = new_best


def tune(problem: Problem, mode: Optional[Literal["train", "forward"]] = None, *,
         strategies: Optional[Sequence[str]] = None, exhaustive: bool = False,
         budget_s: Optional[float] = None, max_configs: Optional[int] = None,
         prior_top: int = 5, refine_top: int = 2, retime_top: int = 3, retime_rounds: Optional[int] = None,
         reps: Optional[int] = None, seed: int = 0, progress: Optional[ProgressFn] = None,
         device: torch.device | str | None = None, max_workspace_bytes: Optional[int] = None,
         save: bool = False, compile_workers: Optional[int] = None,
         patience: Optional[int] = None) -> TuneResult:
    """Find the fastest correct (strategy, config) for ``problem`` (a :class:`ScanProblem`, a
    :class:`DecodeProblem`: any op with a spec in :mod:`samu_tune.opspec`).

    ``mode`` ("train" = forward + backward, "forward") overrides ``problem.backward`` (the
    result's problem has ``backward == (mode == "train")``).  When torch's deterministic mode
    is on, the problem is tuned as deterministic.  ``strategies`` restricts the candidates to
    those names.  ``budget_s``: no new candidate starts after this many seconds (at least one
    is evaluated); ``max_configs``: at most this many candidates are evaluated (verified and
    timed).  ``exhaustive``: evaluate every valid config of every eligible strategy instead of
    timing ``prior_top`` winners of neighbouring tuned problems, screening defaults and
    refining the best ``refine_top`` strategies.  ``retime_top``
    candidates are re-timed interleaved for ``retime_rounds`` rounds (auto when None);
    ``reps`` fixes the samples per candidate (auto when None).  ``progress(TuneEvent)`` is
    called at each candidate's start and finish.  ``device``: the CUDA device (default: the
    current one) for a CUDA problem.  ``max_workspace_bytes`` skips candidates needing more
    workspace (default on CUDA: half the free memory).  ``save`` stores the winner in the cache.
    ``compile_workers``: processes compiling and verifying candidates ahead of timing
    (:mod:`samu_tune.compile_pool`; default ``SAMU_TUNE_COMPILE_WORKERS``, else none;
    :func:`samu_tune.compile_pool.suggested_workers` gives a size for a machine, which
    ``samu-tune profile`` starts by default on a GPU).
    ``patience``: stop refining after that many candidates in a row without a gain of more
    than 1% over the best so far (:class:`samu_tune.evaluate.Search`; ignored when
    ``exhaustive``).
    """
    fields = type(problem).model_fields
    if mode is not None:
        if mode not in ("train", "forward"):
            raise ValueError(f"mode must be 'train' or 'forward', got {mode!r}")
        if "backward" in fields:
            problem = problem.model_copy(update={"backward": mode == "train"})
        elif mode != problem.mode:
            raise ValueError(f"the {problem.op} op is {problem.mode} only; cannot tune it in "
                             f"mode {mode!r}")
    if (torch.are_deterministic_algorithms_enabled() and "deterministic" in fields
            and not problem.deterministic):
        problem = problem.model_copy(update={"deterministic": True})
    if problem.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"cannot tune {problem.key()} for cuda: no CUDA device")
        torch_device = torch.device(device if device is not None else "cuda")
        if torch_device.index is None:
            torch_device = torch.device("cuda", torch.cuda.current_device())
        if max_workspace_bytes is None:
            max_workspace_bytes = torch.cuda.mem_get_info(torch_device)[0] // 2
    else:
        torch_device = torch.device("cpu")
    if max_configs is not None and max_configs < 1:
        raise ValueError(f"max_configs must be >= 1, got {max_configs}")
    dev = device_info(torch_device)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    pairs = registry.eligible(problem, dev, names=strategies)
    ineligible = {s.name: r for s, r in pairs if r}
    runnable = [s for s, r in pairs if not r]
    spaces = {s.name: s.configs(problem) for s in runnable}
    skipped: list[Candidate] = []
    search = Search(problem, dev, torch_device, seed=seed, budget_s=budget_s,
                     max_configs=max_configs, reps=reps, progress=progress,
                     max_workspace_bytes=max_workspace_bytes,
                     pool=_compile_pool(problem, torch_device, seed, compile_workers,
                                        sum(len(v) for v in spaces.values())),
                     patience=None if exhaustive else patience)
    try:
        _search(search, problem, dev, runnable, spaces, skipped, exhaustive=exhaustive,
                prior_top=prior_top, refine_top=refine_top)
    finally:
        if search.pool is not None:
            search.pool.close()

    ranked = sorted((c for c in search.order if c.status == "ok"), key=lambda c: c.time_ms)
    search.retime(ranked[:max(0, retime_top)], retime_rounds)
    ranked = sorted((c for c in search.order if c.status == "ok"), key=lambda c: c.time_ms)
    winner = ranked[0] if ranked else None
    runner_up = ranked[1] if len(ranked) > 1 else None
    margin = (runner_up.time_ms / winner.time_ms - 1.0) if runner_up and winner.time_ms > 0 \
        else None
    kind = timing.timing_kind(problem)
    result = TuneResult(
        problem=problem, mode=problem.mode, device=dev, timing=kind,
        cpu_wall_time=kind == "cpu-wall", search="exhaustive" if exhaustive else "refine",
        winner=winner, runner_up=runner_up, margin=margin,
        candidates=search.order + skipped, ineligible=ineligible, stopped=search.stopped,
        elapsed_s=search.elapsed(), measured_at=started)
    if save and winner is not None:
        from samu_tune import cache
        cache.record(result)
    return result


def _compile_pool(problem: Problem, device: torch.device, seed: int,
                  workers: Optional[int], candidates: int):
    """The tune's :class:`~samu_tune.compile_pool.CompilePool`, or None (no workers asked
    for, a single candidate, or the pool cannot start)."""
    from samu_tune import compile_pool
    from samu_tune.settings import settings
    if workers is None:
        workers = settings().compile_workers or 0
    workers = min(workers, candidates)
    if workers < 1 or candidates < 2:
        return None
    try:
        return compile_pool.CompilePool(problem, device, seed, workers)
    except Exception:     # no process pool here: compile in the tuning process
        return None


def _search(search: Search, problem: Problem, dev: DeviceInfo, runnable: list[Strategy],
            spaces: dict[str, list[BaseModel]], skipped: list[Candidate], *, exhaustive: bool,
            prior_top: int, refine_top: int) -> None:
    """The candidates of a tune, evaluated into ``search`` (see :func:`tune`)."""
    if exhaustive:
        plan = [(s, c) for s in runnable for c in _default_first(s, spaces[s.name], problem)]
        search.prefetch(plan)
        for i, (s, cfg) in enumerate(plan):
            if search.evaluate(s, cfg, "exhaustive", i + 1, len(plan)) is None:
                skipped += [Candidate(strategy=s2.name, config=config_json(c2),
                                      phase="exhaustive", status="skipped",
                                      reason=f"not timed: {search.stopped} reached")
                            for s2, c2 in plan[i:]]
                break
    else:
        priors = _priors(problem, dev, runnable, spaces, prior_top)
        main = [s for s in runnable if s.priority >= 0]
        search.prefetch(priors + [(s, c) for s in main
                                  for c in _default_first(s, spaces[s.name], problem)[:1]])
        for i, (s, cfg) in enumerate(priors):
            if search.evaluate(s, cfg, "prior", i + 1, len(priors)) is None:
                break
        # fallbacks (negative priority: the torch reference) only when nothing else ran; the
        # float64 reference costs seconds per call at real shapes
        fallbacks = [s for s in runnable if s.priority < 0]
        for i, s in enumerate(main + fallbacks):
            if search.stopped:
                break
            if s.priority < 0 and any(c.status == "ok" for c in search.order):
                continue
            ordered = _default_first(s, spaces[s.name], problem)
            # a strategy whose default fails gets one more try with its next config
            for cfg in ordered[:2]:
                cand = search.evaluate(s, cfg, "screen", i + 1, len(main + fallbacks))
                if cand is None or cand.status == "ok":
                    break
            if cand is None:
                break
        for s, cfg in _best_per_strategy(search, runnable)[:max(0, refine_top)]:
            if search.stopped:
                break
            _coordinate_descent(search, s, cfg, spaces[s.name])


def _priors(problem: Problem, dev: DeviceInfo, runnable: list[Strategy],
            spaces: dict[str, list[BaseModel]], limit: int) -> list[tuple[Strategy, BaseModel]]:
    """Up to ``limit`` distinct (strategy, config) winners of the nearest tuned problems with
    the same features (the exact key included: re-tuning starts from the old winner), from the
    user cache then the shipped table; only those this problem's search space holds.  A
    neighbour's winner comes first as its strategy's ``fit`` adapts it to this problem (what
    ``cached`` mode serves), then as stored."""
    if limit <= 0:
        return []
    from samu_tune import cache
    by_name = {s.name: s for s in runnable}
    sig = dev.signature()
    # sorted by (distance, 0 for this problem's own entry / 1 for the same shape's forward
    # entry / 2 for a neighbour's, user cache before shipped table)
    found: list[tuple[float, int, int, Strategy, BaseModel]] = []
    for rank, shipped in enumerate((False, True)):
        try:
            near = cache.nearest(problem, sig, shipped=shipped, include_exact=True,
                                 features=getattr(problem, "prior_features", lambda: None)())
        except Exception:  # an unreadable table never stops tuning
            continue
        for dist, entry in near:
            held = _held(entry.strategy, entry.config, by_name, spaces)
            if held is None:
                continue
            own = entry.key == problem.key()
            strat, cfg = held
            if not own and strat.fit is not None:
                fitted = strat.fit(problem, cfg)
                if fitted != cfg and fitted in spaces[strat.name]:
                    found.append((dist, 2, rank, strat, fitted))
            found.append((dist, 0 if own else 2, rank, strat, cfg))
    found.extend((0.0, 1, 0, strat, cfg)
                 for strat, cfg in _forward_entry(problem, sig, by_name, spaces))
    found.sort(key=lambda item: item[:3])
    out: list[tuple[Strategy, BaseModel]] = []
    for _, _, _, strat, cfg in found:
        if not any(strat is s and cfg == c for s, c in out):
            out.append((strat, cfg))
        if len(out) >= limit:
            break
    return out


def _held(name: str, config: dict, by_name: dict[str, Strategy],
          spaces: dict[str, list[BaseModel]]) -> Optional[tuple[Strategy, BaseModel]]:
    """(strategy, config) of a stored pick when this search space holds it, else None (a
    strategy that cannot run this problem, a config that no longer parses or is out of the
    space)."""
    strat = by_name.get(name)
    if strat is None:
        return None
    try:
        cfg = strat.parse_config(config)
    except (ValueError, TypeError):
        return None
    return (strat, cfg) if cfg in spaces[strat.name] else None


def _forward_entry(problem: Problem, sig: str, by_name: dict[str, Strategy],
                   spaces: dict[str, list[BaseModel]]) -> list[tuple[Strategy, BaseModel]]:
    """For a train problem: the winner and runner-up of the same problem's forward entry (user
    cache, then the shipped table), where this search space holds them.  On the H200 grid the
    forward's two best held the train best at 7 of 10 problems (its three best at all 10;
    docs/performance.md), and their forward kernels are compiled already when forward was
    tuned first (``profile``'s ``mode: both``)."""
    if not getattr(problem, "backward", False):
        return []
    from samu_tune import cache
    forward = problem.model_copy(update={"backward": False})
    out = []
    for shipped in (False, True):
        try:
            entry = cache.lookup(forward, sig, shipped=shipped)
        except Exception:  # an unreadable table never stops tuning
            continue
        if entry is None:
            continue
        picks = [(entry.strategy, entry.config)]
        if entry.runner_up is not None:
            picks.append((entry.runner_up.strategy, entry.runner_up.config))
        out += [held for held in (_held(n, c, by_name, spaces) for n, c in picks)
                if held is not None]
    return out


def _best_per_strategy(search: Search, runnable: list[Strategy]
                       ) -> list[tuple[Strategy, BaseModel]]:
    """Each strategy with an ok candidate and its fastest config so far, fastest first."""
    best: dict[str, tuple[float, Strategy, BaseModel]] = {}
    by_name = {s.name: s for s in runnable}
    for cand in search.order:
        strat = by_name.get(cand.strategy)
        if cand.status != "ok" or strat is None:
            continue
        if cand.strategy not in best or cand.time_ms < best[cand.strategy][0]:
            best[cand.strategy] = (cand.time_ms, strat, strat.parse_config(cand.config))
    return [(s, c) for _, s, c in sorted(best.values(), key=lambda item: item[0])]


def _default_first(strategy: Strategy, space: list[BaseModel], problem: Problem
                   ) -> list[BaseModel]:
    """The config space with the strategy's default (when valid) first."""
    try:
        default = strategy.default_config(problem)
    except Exception:
        return list(space)
    if default in space:
        return [default] + [c for c in space if c != default]
    return list(space)
