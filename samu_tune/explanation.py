"""What dispatch would do for a problem, and why: :func:`explain_problem` -> :class:`Explanation`
(the choice, the sources passed over, every strategy's eligibility); never tunes."""
from __future__ import annotations

from typing import Any, Optional

import torch
from pydantic import BaseModel

from samu_tune import registry
from samu_tune.dispatch import StrategyArg, _signature, choose
from samu_tune.problem import Problem
from samu_tune.rules import NoEligibleStrategy, usable_config
from samu_tune.settings import settings


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


def explain_problem(problem: Problem, *, strategy: StrategyArg = "auto",
                    policy: Optional[str] = None, device: Optional[torch.device] = None
                    ) -> Explanation:
    """Explain dispatch for ``problem`` (of any op) on ``device``.

    Never tunes (under the online policy a miss says it would tune).  Every registered
    strategy is listed with its eligibility reasons.
    """
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
