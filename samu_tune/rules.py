"""Rule-based strategy choice: what dispatch runs when nothing tuned applies.

:func:`rule_choice` first asks the shape rules in :data:`RULES` (each ``rule(problem,
eligible) -> (name, why) | None``, first answer wins; GPU measurements are meant to refine
them), then falls back to the highest-priority eligible strategy (``Strategy.priority``,
set by each strategy module) with its default config.  Those are the scan's rules; another
op's are its spec's ``rules`` (:mod:`samu_tune.opspec`; the scan's spec holds :data:`RULES`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

from pydantic import BaseModel

from samu_tune import opspec, registry
from samu_tune.device import DeviceInfo, device_info
from samu_tune.problem import Problem
from samu_tune.registry import Strategy


class NoEligibleStrategy(ValueError):
    """No registered strategy can run the problem; the message lists every strategy's reasons."""


class RuleChoice(NamedTuple):
    strategy: Strategy
    config: BaseModel
    why: str


Rule = Callable[[Problem, list[Strategy]], Optional[tuple[str, str]]]

# Shape rules, most specific first: the strategies set priorities, and rules are added here
# once GPU measurements show where priority order is wrong.

# B L M from which the read-once scan wins, forward and training (H100, docs/performance.md:
# forward 0.236 / 0.083 / 0.072 ms against lookback's 0.300 / 0.101 / 0.086 at (8, 8192, 1024),
# (4, 16384, 256), (16, 1024, 1024); training 0.655 / 0.2226 / 0.198 / 0.2606 against 0.709 /
# 0.2338 / 0.203 / 0.2832 there and at (2, 65536, 128); below, at (4, 4096, 512), a tie forward
# and 0.128 against 0.121 training)
READ_ONCE_MIN_ELEMENTS = 1 << 24
# the read-once strategies, first choice first: ``lookback_staged`` runs ``lookback_once``'s
# forward kernel and a backward that reads d out once (at (4, 16384, 256) on an H100, training
# 0.185 ms against ``lookback_once``'s default 0.208)
READ_ONCE = ("lookback_staged", "lookback_once")


def _read_once(problem: Problem, eligible: list[Strategy]) -> Optional[tuple[str, str]]:
    """Large scans: the read-once scan (each input read once), the first of
    :data:`READ_ONCE` that is eligible."""
    if problem.op != "scan" or problem.B * problem.L * problem.M < READ_ONCE_MIN_ELEMENTS:
        return None
    names = {s.name for s in eligible}
    name = next((n for n in READ_ONCE if n in names), READ_ONCE[-1])
    return name, f"B L M >= {READ_ONCE_MIN_ELEMENTS}: the read-once scan"


RULES: list[Rule] = [_read_once]


def usable_config(strategy: Strategy, problem: Problem) -> Optional[BaseModel]:
    """The strategy's default config if valid for ``problem``, else its first valid one."""
    try:
        cfg = strategy.default_config(problem)
        if strategy.valid is None or strategy.valid(problem, cfg):
            return cfg
    except ValueError:
        pass
    configs = strategy.configs(problem)
    return configs[0] if configs else None


def rule_choice(problem: Problem, device: Optional[DeviceInfo] = None) -> RuleChoice:
    """The rule-based (strategy, config) for ``problem``; raises :class:`NoEligibleStrategy`."""
    if device is None:
        device = device_info("cuda" if problem.device == "cuda" else "cpu")
    pairs = registry.eligible(problem, device)
    ok = [s for s, reasons in pairs if not reasons]
    by_name = {s.name: s for s in ok}
    for rule in opspec.of(problem).rules:
        answer = rule(problem, ok)
        if answer is not None and answer[0] in by_name:
            cfg = usable_config(by_name[answer[0]], problem)
            if cfg is not None:
                return RuleChoice(by_name[answer[0]], cfg, answer[1])
    for strat in ok:
        cfg = usable_config(strat, problem)
        if cfg is not None:
            return RuleChoice(strat, cfg,
                              f"highest-priority eligible strategy (priority {strat.priority})")
    raise NoEligibleStrategy(
        f"no strategy can run {problem.key()} on {problem.device}:\n"
        + registry.format_reasons(pairs))
