"""Choosing a (strategy, config) for a problem of any op, memoized per call signature.

Choosing (:func:`choose`), by policy (``SAMU_TUNE_MODE``):

- ``cached`` (default): the exact problem key in the user cache; else the nearest tuned key
  with the same features (``ScanProblem.feature_key()``: dtypes, mode, resets, h0, final,
  determinism, whether M is a multiple of 8 and whether the problem is narrow or long,
  ``ScanProblem.narrow`` / ``long``) in log-space of (B*M, L); else the same two
  lookups in the table shipped in ``samu_tune/defaults/<device signature>.json``; else
  :func:`samu_tune.rules.rule_choice`.
  A cached (strategy, config) that cannot run this exact problem (strategy ineligible, config
  invalid for this M, ...) falls through to the next candidate or source.
- ``online``: an exact hit, else tune now (budget ``SAMU_TUNE_TUNE_BUDGET_S``), store the
  winner and use it; if tuning finds nothing, the ``cached`` chain.
- ``off``: the rule-based choice only.
- ``strategy="name"`` or ``("name", config)`` forces a strategy (default config when None).

Decisions are memoized in-process per (call signature, device, policy), so a cache hit costs a
few dictionary lookups; the memo is dropped when the cache file, the registry or the settings
change.  Never tuned while a CUDA graph is being captured (the cached/rule choice is used and
not memoized).  Under ``torch.distributed`` the decision is made on rank 0 and broadcast, so all
ranks run the same strategy; like any collective this needs every rank to call ``scan`` on
the same sequence of problems the first time each is seen (it is memoized afterwards and not
re-synchronised, even when the cache file changes).  Under torch.compile an op's kernels are
its operators (``samu_tune/ops/<op>/library.py``), which decide inside.

Every op goes through the same :func:`choose` (the problem's ``op`` picks its strategies, cache
keys and rules; a fallback such as the scan's "without initial/final state" is the op spec's
``relax``) and memo (:func:`decide`); the scan asks for the distributed broadcast.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Hashable, NamedTuple, Optional, Union

import torch
from pydantic import BaseModel

from samu_tune import cache, opspec, registry
from samu_tune.device import DeviceInfo, device_info
from samu_tune.problem import Problem
from samu_tune.registry import Strategy
from samu_tune.rules import NoEligibleStrategy, RuleChoice, rule_choice
from samu_tune.settings import settings

log = logging.getLogger(__name__)

StrategyArg = Union[str, tuple[str, Union[BaseModel, dict, None]]]

__all__ = ["resolve", "choose", "decide", "rule_choice", "Decision",
           "NoEligibleStrategy", "clear_memo"]


class Decision(NamedTuple):
    """What :func:`choose` picked.  ``source`` is one of ``forced``, ``exact``, ``nearest``,
    ``default`` (shipped table), ``rule``, ``online`` (tuned just now); ``source_key`` is the
    cache key it came from (exact/nearest/default/online); ``detail`` says why in words."""

    strategy: Strategy
    config: BaseModel
    source: str
    source_key: Optional[str] = None
    detail: str = ""


# ---- helpers ---------------------------------------------------------------------------------

def _capturing() -> bool:
    """True while the current CUDA stream is capturing a graph."""
    if torch.compiler.is_compiling():    # dynamo tracing an eager path: no stream to ask
        return False
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except (RuntimeError, AssertionError):  # CPU-only builds
        return False


def _distributed() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _signature(problem: Problem, device: Optional[torch.device] = None) -> DeviceInfo:
    if problem.device == "cuda":
        return device_info(device if device is not None and device.type == "cuda" else "cuda")
    return device_info("cpu")


def _bad_config(name: str, strat: Strategy, config: Any, exc: Exception) -> ValueError:
    fields = {n: str(f.annotation).replace("typing.", "")
              for n, f in strat.config_model.model_fields.items()}
    first = str(exc).strip().splitlines()
    detail = "; ".join(line.strip() for line in first[1:3]) if len(first) > 1 else str(exc)
    return ValueError(f"bad config {config!r} for strategy {name!r}: {detail}; "
                      f"config fields: {fields}")


def _usable(entry: cache.CacheEntry, problem: Problem, dev: DeviceInfo
            ) -> tuple[Optional[tuple[Strategy, BaseModel]], str]:
    """(strategy, config) of a cached entry if it can run ``problem``, else (None, why)."""
    try:
        strat = registry.get(entry.strategy, problem.op)
    except ValueError:
        return None, f"strategy {entry.strategy!r} not registered"
    reasons = strat.reasons(problem, dev)
    if reasons:
        return None, f"{entry.strategy} cannot run it: {'; '.join(reasons)}"
    try:
        cfg = strat.parse_config(entry.config)
    except (ValueError, TypeError) as exc:
        return None, f"config {entry.config} does not parse: {str(exc).splitlines()[0]}"
    if strat.valid is not None and not strat.valid(problem, cfg):
        return None, f"config {entry.config} of {entry.strategy} not valid for this problem"
    return (strat, cfg), ""


def _from_tables(problem: Problem, dev: DeviceInfo, trail: list[str], *,
                 exact: bool = True) -> Optional[Decision]:
    """exact -> nearest in the user cache, then exact -> nearest in the shipped table."""
    sig = dev.signature()
    for shipped in (False, True):
        where = "shipped table" if shipped else "cache"
        if exact or shipped:
            entry = cache.lookup(problem, sig, shipped=shipped)
            if entry is not None:
                found, why = _usable(entry, problem, dev)
                if found:
                    return Decision(*found, "default" if shipped else "exact", entry.key,
                                    f"{where} entry for this exact problem "
                                    f"({entry.time_ms:.4g} ms when tuned)"
                                    + _older_source(entry, found[0]))
                trail.append(f"{where} exact {entry.key}: {why}")
            else:
                trail.append(f"{where}: no exact entry for {problem.key()}")
        near = cache.nearest(problem, sig, shipped=shipped)
        for dist, entry in near:
            found, why = _usable(entry, problem, dev)
            if found:
                strat, cfg = found
                fitted, note = _fitted(strat, cfg, problem)
                return Decision(strat, fitted, "default" if shipped else "nearest", entry.key,
                                f"nearest tuned key in the {where} (log-distance {dist:.3g})"
                                + note + _older_source(entry, strat))
            trail.append(f"{where} nearest {entry.key}: {why}")
        if not near:
            trail.append(f"{where}: no entry with features {problem.feature_key()}")
    return None


def _fitted(strat: Strategy, cfg: BaseModel, problem: Problem) -> tuple[BaseModel, str]:
    """A nearest entry's config adapted to ``problem`` by the strategy's ``fit`` (kept as is
    where it has none, or where the adapted config is not valid), and a note of what changed."""
    if strat.fit is None:
        return cfg, ""
    new = strat.fit(problem, cfg)
    if new == cfg or (strat.valid is not None and not strat.valid(problem, new)):
        return cfg, ""
    changed = ", ".join(f"{k} {getattr(cfg, k)} -> {getattr(new, k)}"
                        for k in type(cfg).model_fields if getattr(cfg, k) != getattr(new, k))
    return new, f"; fitted to this problem: {changed}"


def _older_source(entry: cache.CacheEntry, strat: Strategy) -> str:
    """A note when ``entry`` (only a shipped one can be served so) was measured with an older
    source of its strategy: its time may no longer hold, and another choice may now win."""
    if entry.source_hash and entry.source_hash != strat.source_hash:
        return (f"; measured with an older {strat.name} source ({entry.source_hash} != "
                f"{strat.source_hash}): re-tune or re-ship to refresh")
    return ""


def _rule(problem: Problem, dev: DeviceInfo) -> Decision:
    choice: RuleChoice = rule_choice(problem, dev)
    return Decision(choice.strategy, choice.config, "rule", None, choice.why)


def split_strategy(strategy: StrategyArg) -> tuple[str, object]:
    """(name, config or None) of a strategy argument other than ``"auto"``; TypeError for any
    other form."""
    if isinstance(strategy, str):
        return strategy, None
    if isinstance(strategy, (tuple, list)) and len(strategy) == 2:
        return strategy[0], strategy[1]
    raise TypeError(f"strategy must be 'auto', a strategy name or (name, config), "
                    f"got {strategy!r}")


def _forced(problem: Problem, strategy: StrategyArg, dev: DeviceInfo) -> Decision:
    name, config = split_strategy(strategy)
    strat = registry.get(name, problem.op)
    reasons = strat.reasons(problem, dev)
    if reasons:
        raise NoEligibleStrategy(f"strategy {name!r} cannot run {problem.key()}: "
                                 + "; ".join(reasons))
    try:
        cfg = strat.parse_config(config, problem)
    except (ValueError, TypeError) as exc:
        raise _bad_config(name, strat, config, exc) from None
    if strat.valid is not None and not strat.valid(problem, cfg):
        raise ValueError(f"config {cfg!r} of strategy {name!r} is not valid for {problem.key()}")
    return Decision(strat, cfg, "forced", None,
                    "forced by strategy=" + ("name (default config)" if config is None
                                            else "(name, config)"))


def _online(problem: Problem, dev: DeviceInfo, device: Optional[torch.device],
            trail: list[str]) -> Optional[Decision]:
    from samu_tune.tuner import tune
    try:
        result = tune(problem, budget_s=settings().tune_budget_s,
                      patience=settings().tune_patience,
                      device=device if problem.device == "cuda" else None)
    except NoEligibleStrategy:
        raise
    except Exception as exc:
        trail.append(f"online tuning failed: {type(exc).__name__}: {exc}")
        return None
    if result.winner is None:
        trail.append("online tuning found no working candidate")
        return None
    try:
        cache.record(result)
    except Exception as exc:  # a read-only cache must not stop the run
        warnings.warn(f"samu_tune: could not store the tuned winner: {exc}", stacklevel=4)
    w = result.winner
    strat = registry.get(w.strategy, problem.op)
    return Decision(strat, strat.parse_config(w.config), "online", problem.key(),
                    f"tuned now: {w.time_ms:.4g} ms, {len(result.candidates)} candidates")


def choose(problem: Problem, strategy: StrategyArg = "auto", *,
           policy: Optional[str] = None, device: Optional[torch.device] = None,
           allow_tune: bool = True, trail: Optional[list[str]] = None,
           on: Optional[DeviceInfo] = None) -> Decision:
    """The (strategy, config) dispatch runs for ``problem``, with where it came from.

    ``policy`` overrides ``SAMU_TUNE_MODE``; ``allow_tune=False`` never tunes (explain, CUDA
    graph capture); ``trail`` collects why earlier sources were skipped; ``on`` chooses as on
    that GPU instead of ``device``'s (a replay of another machine's recorded run).  Local to
    this process: no memo, no distributed broadcast (see :func:`decide`).
    """
    trail = [] if trail is None else trail
    dev = on if on is not None else _signature(problem, device)
    if not (isinstance(strategy, str) and strategy == "auto"):
        return _forced(problem, strategy, dev)
    policy = policy or settings().mode
    if policy not in ("cached", "online", "off"):
        raise ValueError(f"policy must be cached, online or off, got {policy!r}")
    if policy == "off":
        trail.append("policy off: rule-based choice only")
        return _rule(problem, dev)
    if policy == "online":
        entry = cache.lookup(problem, dev.signature())
        if entry is not None:
            found, why = _usable(entry, problem, dev)
            if found:
                return Decision(*found, "exact", entry.key,
                                f"cache entry for this exact problem ({entry.time_ms:.4g} ms)")
            trail.append(f"cache exact {entry.key}: {why}")
        if not allow_tune:
            trail.append("online policy: would tune this problem now (not tuning here)")
        elif _capturing():
            trail.append("online policy: not tuning while a CUDA graph is being captured")
        else:
            decision = _online(problem, dev, device, trail)
            if decision is not None:
                return decision
    found = _from_tables(problem, dev, trail, exact=policy != "online")
    if found is None:
        found = _relaxed(problem, dev, trail)
    return found if found is not None else _rule(problem, dev)


def _relaxed(problem: Problem, dev: DeviceInfo, trail: list[str]) -> Optional[Decision]:
    """The tables' choice for the op spec's relaxed problem (``OpSpec.relax``; the scan: the
    same problem without initial / final state, see :func:`samu_tune.ops.scan.spec.
    without_state_features`).  The entry must still run ``problem`` (capability and config
    checked against the real problem)."""
    relax = opspec.of(problem).relax
    relaxed = relax(problem) if relax is not None else None
    if relaxed is None:
        return None
    plain, label = relaxed
    sub_trail: list[str] = []
    found = _from_tables(plain, dev, sub_trail)
    trail += [f"{label}: {t}" for t in sub_trail]
    if found is None:
        return None
    strat, cfg = found.strategy, found.config
    if strat.reasons(problem, dev) or (strat.valid is not None and not strat.valid(problem, cfg)):
        trail.append(f"{label}: {strat.name} cannot run {problem.key()}")
        return None
    return Decision(strat, cfg, found.source, found.source_key,
                    found.detail + f" (tuned {label})")


def resolve(problem: Problem, strategy: StrategyArg = "auto") -> tuple[Strategy, BaseModel]:
    """The (strategy, config) that a call runs for ``problem`` (this process's choice)."""
    d = choose(problem, strategy)
    return d.strategy, d.config


# ---- the memo and the distributed broadcast ------------------------------------------------

# key -> (settings object, registry dict, signature, cache generation or None, Decision)
_MEMO: dict[tuple, tuple] = {}
_MEMO_MAX = 4096


def clear_memo() -> None:
    """Forget memoized decisions (they are also dropped when cache/registry/settings change)."""
    _MEMO.clear()


def _broadcast(problem: Problem, strategy: StrategyArg, device: Optional[torch.device]
               ) -> Decision:
    """Rank 0 decides, every rank adopts it (a rank whose own problem rank 0's choice cannot
    run keeps its local choice)."""
    import torch.distributed as dist
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            d = choose(problem, strategy, device=device)
            payload[0] = ("ok", problem.key(), d.strategy.name, d.config.model_dump(mode="json"),
                          d.source, d.source_key, d.detail)
        except Exception as exc:
            payload[0] = ("error", problem.key(), type(exc).__name__, str(exc))
            dist.broadcast_object_list(payload, src=0)
            raise
        dist.broadcast_object_list(payload, src=0)
        return d
    dist.broadcast_object_list(payload, src=0)
    msg = payload[0]
    if msg[0] == "error":
        raise NoEligibleStrategy(f"rank 0 could not choose a strategy for {msg[1]}: "
                                 f"{msg[2]}: {msg[3]}")
    _, key, name, config, source, source_key, detail = msg
    dev = _signature(problem, device)
    try:
        strat = registry.get(name, problem.op)
        cfg = strat.parse_config(config)
        ok = not strat.reasons(problem, dev) and (strat.valid is None or strat.valid(problem, cfg))
    except (ValueError, TypeError):
        ok = False
    if ok:
        return Decision(strat, cfg, source, source_key,
                        f"rank 0's choice (for {key}): {detail}")
    log.warning("samu_tune: rank 0 chose %s for %s, which cannot run %s here; using the local "
                "choice", name, key, problem.key())
    return choose(problem, strategy, device=device, allow_tune=False)


def _memo_hit(memo_key: tuple, s) -> Optional[Decision]:
    """The memoized decision, unless the settings, registry or cache changed since (the
    cache's generation looks at its files at most every ``cache.RELOAD_CHECK_S`` seconds)."""
    hit = _MEMO.get(memo_key)
    if hit is not None and hit[0] is s and hit[1] is registry._REGISTRY and (
            hit[3] is None or hit[3] == cache.generation(hit[2])):
        return hit[4]
    return None


def decide(call_key: Hashable, problem: Callable[[], Problem], device: Optional[torch.device],
           strategy: StrategyArg = "auto", *, broadcast: bool = False) -> Decision:
    """:func:`choose`, memoized, for a call of any op.

    ``call_key``: a hashable tuple of everything ``problem()`` reads from the call (it must
    differ between ops, e.g. start with the op's name); ``problem()`` builds the problem only
    on a miss.  Never tunes during CUDA graph capture.  ``broadcast``: under
    ``torch.distributed`` rank 0 decides and every rank adopts it (the scan); otherwise each
    rank chooses locally (the same cache files give the same choice).
    """
    s = settings()
    memo_key = None
    if isinstance(strategy, str):
        memo_key = (call_key, strategy, s.mode, registry.generation())
        hit = _memo_hit(memo_key, s)
        if hit is not None:
            return hit
    return _decide_miss(memo_key, problem(), device, strategy, s, broadcast)


def _decide_miss(memo_key: Optional[tuple], problem: Problem, device: Optional[torch.device],
                 strategy: StrategyArg, s, broadcast: bool) -> Decision:
    capturing = _capturing()
    if capturing:
        decision = choose(problem, strategy, device=device, allow_tune=False)
    elif broadcast and _distributed() and strategy == "auto":
        decision = _broadcast(problem, strategy, device)
    else:
        decision = choose(problem, strategy, device=device)
    if s.verbose:
        log.info("samu_tune: %s -> %s %s (%s%s) %s", problem.key(), decision.strategy.name,
                 decision.config.model_dump(), decision.source,
                 f" {decision.source_key}" if decision.source_key else "", decision.detail)
    if memo_key is not None and not capturing:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        sig = _signature(problem, device).signature()
        # a forced or broadcast decision does not depend on the cache file
        stable = strategy != "auto" or (broadcast and _distributed())
        _MEMO[memo_key] = (s, registry._REGISTRY, sig,
                           None if stable else cache.generation(sig), decision)
    return decision
