"""``samu_tune.scan``: validate -> ScanProblem -> choose a strategy -> run it.

Choosing (:func:`choose`), by policy (``SAMU_TUNE_MODE``):

- ``cached`` (default): the exact problem key in the user cache; else the nearest tuned key
  with the same features (``ScanProblem.feature_key()``: dtypes, mode, resets, h0, final,
  determinism) in log-space of (B*M, L); else the same two lookups in the table shipped in
  ``samu_tune/defaults/<device signature>.json``; else :func:`samu_tune.rules.rule_choice`.
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
re-synchronised, even when the cache file changes).  Under torch.compile ``scan`` is
traced: its kernels are the operators of :mod:`samu_tune.torch_ops`, which decide inside.

Other ops (the decode step) go through the same :func:`choose` (their problem's ``op`` picks
their strategies, cache keys and rules; the scan-only "without initial/final state" fallback is
the op spec's ``relax``) and memo (:func:`decide`), without the distributed broadcast.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Hashable, NamedTuple, Optional, Union

import torch
from pydantic import BaseModel

from . import cache, opspec, registry
from .device import DeviceInfo, device_info
from .problem import PROBLEM_TYPES, Problem, ScanProblem
from .registry import Strategy
from .rules import NoEligibleStrategy, RuleChoice, rule_choice, usable_config
from .settings import settings
from .tensors import ScanInputs, ScanOutput
from .validation import validate

log = logging.getLogger(__name__)

StrategyArg = Union[str, tuple[str, Union[BaseModel, dict, None]]]

__all__ = ["scan", "resolve", "choose", "decide", "explain", "rule_choice", "Decision",
           "Explanation", "NoEligibleStrategy", "clear_memo", "problem_of", "run"]


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
                return Decision(*found, "default" if shipped else "nearest", entry.key,
                                f"nearest tuned key in the {where} (log-distance {dist:.3g})"
                                + _older_source(entry, found[0]))
            trail.append(f"{where} nearest {entry.key}: {why}")
        if not near:
            trail.append(f"{where}: no entry with features {problem.feature_key()}")
    return None


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


def _forced(problem: Problem, strategy: StrategyArg, dev: DeviceInfo) -> Decision:
    if isinstance(strategy, str):
        name, config = strategy, None
    elif isinstance(strategy, (tuple, list)) and len(strategy) == 2:
        name, config = strategy
    else:
        raise TypeError(f"strategy must be 'auto', a strategy name or (name, config), "
                        f"got {strategy!r}")
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
    from .tuner import tune
    try:
        result = tune(problem, budget_s=settings().tune_budget_s,
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
           allow_tune: bool = True, trail: Optional[list[str]] = None) -> Decision:
    """The (strategy, config) dispatch runs for ``problem``, with where it came from.

    ``policy`` overrides ``SAMU_TUNE_MODE``; ``allow_tune=False`` never tunes (explain, CUDA
    graph capture); ``trail`` collects why earlier sources were skipped.  Local to this
    process: no memo, no distributed broadcast (see :func:`scan`).
    """
    trail = [] if trail is None else trail
    dev = _signature(problem, device)
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
    same problem without initial / final state, see :func:`samu_tune.scan_op.
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
    """The (strategy, config) that :func:`scan` runs for ``problem`` (this process's choice)."""
    d = choose(problem, strategy)
    return d.strategy, d.config


# ---- the memo and the distributed broadcast ------------------------------------------------

# key -> (settings object, registry dict, signature, cache generation or None, Decision)
_MEMO: dict[tuple, tuple] = {}
_MEMO_MAX = 4096


def clear_memo() -> None:
    """Forget memoized decisions (they are also dropped when cache/registry/settings change)."""
    _MEMO.clear()


def _fast_key(inputs: ScanInputs, backward: Optional[bool] = None) -> tuple:
    """Everything ScanProblem.from_tensors reads, without building a pydantic model
    (``backward`` given: the caller knows whether gradients will be taken)."""
    br = inputs.br
    if backward is None:
        backward = torch.is_grad_enabled() and (
            inputs.eta.requires_grad or inputs.delta.requires_grad
            or inputs.nu_log.requires_grad or inputs.theta_log.requires_grad
            or br.requires_grad or inputs.bi.requires_grad
            or (inputs.initial_state is not None
                and (inputs.initial_state[0].requires_grad
                     or inputs.initial_state[1].requires_grad)))
    return (br.shape, br.dtype, inputs.eta.dtype, br.device, backward,
            inputs.segment_pos is not None, inputs.initial_state is not None,
            inputs.output_final_state, torch.are_deterministic_algorithms_enabled())


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
    """The memoized decision, unless the settings, registry or cache changed since."""
    hit = _MEMO.get(memo_key)
    if hit is not None and hit[0] is s and hit[1] is registry._REGISTRY and (
            hit[3] is None or hit[3] == cache.generation(hit[2])):
        return hit[4]
    return None


def _decide(inputs: ScanInputs, strategy: StrategyArg, backward: Optional[bool] = None
            ) -> Decision:
    """The scan's memoized decision for validated ``inputs`` (``backward``: see
    :func:`_fast_key`; the operators of :mod:`samu_tune.torch_ops` pass it, their tensors
    carry no autograd state)."""
    s = settings()
    memo_key = None
    if isinstance(strategy, str):
        memo_key = (_fast_key(inputs, backward), strategy, s.mode, registry.generation())
        hit = _memo_hit(memo_key, s)
        if hit is not None:
            return hit
    return _decide_miss(memo_key, problem_of(inputs, backward), inputs.br.device, strategy, s,
                        True)


def decide(call_key: Hashable, problem: Callable[[], Problem], device: Optional[torch.device],
           strategy: StrategyArg = "auto") -> Decision:
    """:func:`choose`, memoized like :func:`scan`'s decision, for any op.

    ``call_key``: a hashable tuple of everything ``problem()`` reads from the call (it must
    differ between ops, e.g. start with the op's name); ``problem()`` builds the problem only
    on a miss.  Never tunes during CUDA graph capture; no distributed broadcast (each rank
    chooses locally: the same cache files give the same choice).
    """
    s = settings()
    memo_key = None
    if isinstance(strategy, str):
        memo_key = (call_key, strategy, s.mode, registry.generation())
        hit = _memo_hit(memo_key, s)
        if hit is not None:
            return hit
    return _decide_miss(memo_key, problem(), device, strategy, s, False)


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


# ---- scan ------------------------------------------------------------------------------------

# torch.compile must not trace the decision (it reads files, clocks and a memo): under
# compilation scan calls the operators of samu_tune.torch_ops, which decide inside.
# torch._disable_dynamo is torch.compiler.disable with the import of torch._dynamo (about 2 s
# on a slow host) deferred to the first call.
_disable_dynamo = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable
_is_compiling = getattr(torch.compiler, "is_compiling", None) or (lambda: False)


def scan(eta: torch.Tensor, delta: torch.Tensor, nu_log: torch.Tensor, theta_log: torch.Tensor,
         br: torch.Tensor, bi: torch.Tensor, *,
         initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
         segment_pos: Optional[torch.Tensor] = None, output_final_state: bool = False,
         strategy: StrategyArg = "auto") -> ScanOutput:
    """The SAMU scan ``h[t] = A[t] h[t-1] + (br[t] + i bi[t])`` (see ``samu_tune.reference``).

    eta, delta: [B, L]; nu_log, theta_log: [M]; br, bi: [B, L, M];
    initial_state: (h0_r, h0_i) each [B, M]; segment_pos: integer [B, L], 0 starts a sequence.
    Returns ``ScanOutput(real, imag, final_state)``: [B, L, M] in br's dtype, and fp32
    (h_r, h_i) [B, M] when ``output_final_state``.  ``strategy`` is ``"auto"`` (the dispatch
    policy, see :mod:`samu_tune.dispatch`), a registered name, or ``(name, config)``.
    Under torch.compile the kernels run as the operators ``samu_tune::scan_fwd`` /
    ``scan_bwd`` (:mod:`samu_tune.torch_ops`: no graph break, CUDA-graph capturable); float64
    inputs and CPU tensors without the Triton interpreter trace the torch reference.
    """
    if _is_compiling():
        return _scan_traced(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                            output_final_state, strategy)
    return _scan(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                 output_final_state, strategy)


def _scan(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
          output_final_state, strategy) -> ScanOutput:
    inputs = validate(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                      segment_pos=segment_pos, output_final_state=output_final_state)
    decision = _decide(inputs, strategy)
    return run(decision.strategy, decision.config, inputs)


def _scan_traced(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                 output_final_state, strategy) -> ScanOutput:
    """:func:`scan` under torch.compile: validation traced, the kernels as operators."""
    from . import torch_ops
    from .reference import scan_reference
    inputs = validate(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                      segment_pos=segment_pos, output_final_state=output_final_state)
    if (strategy == "reference" or inputs.br.dtype == torch.float64
            or inputs.eta.dtype == torch.float64 or inputs.nu_log.dtype == torch.float64
            or (not inputs.br.is_cuda and not settings().interpret)):
        return scan_reference(inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log,
                              inputs.br, inputs.bi, initial_state=inputs.initial_state,
                              segment_pos=inputs.segment_pos,
                              output_final_state=inputs.output_final_state)
    if not torch_ops.operators_serve(torch_ops.strategy_string(strategy)):
        return _scan_eager(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                           output_final_state, strategy)
    return torch_ops.scan(inputs, strategy)


# a strategy without an autograd Function (one registered from outside) runs eagerly behind a
# graph break under torch.compile: the operators cannot split its forward from its backward
_scan_eager = _disable_dynamo(_scan)


def problem_of(inputs: ScanInputs, backward: Optional[bool] = None) -> ScanProblem:
    return ScanProblem.from_tensors(
        inputs.eta, inputs.br, segment_pos=inputs.segment_pos,
        initial_state=inputs.initial_state, output_final_state=inputs.output_final_state,
        backward=backward, tensors=inputs.differentiable())


def run(strat: Strategy, cfg: BaseModel, inputs: ScanInputs) -> ScanOutput:
    """Run a chosen strategy; normalises ``final_state`` to None when not asked for."""
    out = strat.run(inputs, cfg)
    if not inputs.output_final_state and out.final_state is not None:
        out = ScanOutput(out.real, out.imag, None)
    return out


# ---- explain ---------------------------------------------------------------------------------

class StrategyReport(BaseModel):
    name: str
    description: str
    priority: int
    eligible: bool
    reasons: list[str]
    default_config: Optional[dict[str, Any]] = None
    configs: int = 0
    deterministic: bool = True


class Explanation(BaseModel):
    """What dispatch would do for a problem, and why; ``str()`` gives the text form.

    ``source``: forced / exact / nearest / default / rule (or None with ``error`` when nothing
    can run); ``source_key``: the cache key used for exact / nearest / default; ``trail``:
    why earlier sources were passed over; ``strategies``: every registered strategy with its
    eligibility reasons.
    """

    problem: Problem
    signature: str
    policy: str
    strategy: Optional[str] = None
    config: Optional[dict[str, Any]] = None
    source: Optional[str] = None
    source_key: Optional[str] = None
    detail: str = ""
    trail: list[str] = []
    error: Optional[str] = None
    strategies: list[StrategyReport] = []

    def text(self) -> str:
        lines = [f"problem {self.problem.key()} on {self.signature} (policy {self.policy})"]
        if self.strategy is not None:
            cfg = ", ".join(f"{k}={v}" for k, v in (self.config or {}).items()) or "-"
            key = f" [{self.source_key}]" if self.source_key else ""
            lines.append(f"choice: {self.strategy} ({cfg}) from {self.source}{key}: {self.detail}")
        else:
            lines.append(f"choice: none: {self.error}")
        if self.trail:
            lines.append("passed over:")
            lines += [f"  - {t}" for t in self.trail]
        lines.append("strategies:")
        for r in self.strategies:
            state = "eligible" if r.eligible else "ineligible: " + "; ".join(r.reasons)
            lines.append(f"  {r.name} (priority {r.priority}, {r.configs} configs): {state}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def explain(*args, strategy: StrategyArg = "auto", policy: Optional[str] = None,
            **kwargs) -> Explanation:
    """Explain dispatch for ``explain(problem)`` (of any op: a :class:`ScanProblem`, a
    :class:`DecodeProblem`) or ``explain(<the arguments of scan>)``.

    Never tunes (under the online policy a miss says it would tune).  Every registered
    strategy is listed with its eligibility reasons.
    """
    if len(args) == 1 and not kwargs and isinstance(args[0], tuple(PROBLEM_TYPES.values())):
        problem = args[0]
        device = None
    else:
        inputs = validate(*args, **kwargs)
        problem = problem_of(inputs)
        device = inputs.br.device
    dev = _signature(problem, device)
    policy = policy or settings().mode
    reports = []
    for strat, reasons in registry.eligible(problem, dev):
        cfg = usable_config(strat, problem) if not reasons else None
        reports.append(StrategyReport(
            name=strat.name, description=strat.description, priority=strat.priority,
            eligible=not reasons, reasons=reasons,
            default_config=None if cfg is None else cfg.model_dump(mode="json"),
            configs=len(strat.configs(problem)) if not reasons else 0,
            deterministic=strat.capability.deterministic))
    trail: list[str] = []
    out = Explanation(problem=problem, signature=dev.signature(), policy=policy, trail=trail,
                      strategies=reports)
    try:
        d = choose(problem, strategy, policy=policy, device=device, allow_tune=False,
                   trail=trail)
    except (NoEligibleStrategy, ValueError) as exc:
        out.error = str(exc)
        out.trail = trail
        return out
    out.strategy, out.config = d.strategy.name, d.config.model_dump(mode="json")
    out.source, out.source_key, out.detail = d.source, d.source_key, d.detail
    out.trail = trail
    return out
