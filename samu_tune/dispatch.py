"""``samu_tune.scan``: validate -> ScanProblem -> choose a strategy -> run it."""
from __future__ import annotations

from typing import Optional, Union

import torch
from pydantic import BaseModel

from . import registry
from .device import device_info
from .problem import ScanProblem
from .registry import Strategy
from .tensors import ScanInputs, ScanOutput
from .validation import validate

StrategyArg = Union[str, tuple[str, Union[BaseModel, dict, None]]]


class NoEligibleStrategy(ValueError):
    """No registered strategy can run the problem; the message lists every strategy's reasons."""


def _rule_choice(problem: ScanProblem) -> tuple[Strategy, BaseModel]:
    """Highest-priority eligible strategy with its default config."""
    pairs = registry.eligible(problem)
    for strat, reasons in pairs:
        if not reasons:
            return strat, strat.default_config(problem)
    raise NoEligibleStrategy(
        f"no strategy can run {problem.key()} on {problem.device}:\n"
        + registry.format_reasons(pairs))


def resolve(problem: ScanProblem, strategy: StrategyArg = "auto") -> tuple[Strategy, BaseModel]:
    """The (strategy, config) that :func:`scan` runs for ``problem``."""
    if strategy == "auto":
        return _rule_choice(problem)
    name, config = (strategy, None) if isinstance(strategy, str) else strategy
    strat = registry.get(name)
    reasons = strat.reasons(problem, device_info(problem.device))
    if reasons:
        raise NoEligibleStrategy(f"strategy {name!r} cannot run {problem.key()}: "
                                 + "; ".join(reasons))
    cfg = strat.parse_config(config, problem)
    if strat.valid is not None and not strat.valid(problem, cfg):
        raise ValueError(f"config {cfg!r} of strategy {name!r} is not valid for {problem.key()}")
    return strat, cfg


def scan(eta: torch.Tensor, delta: torch.Tensor, nu_log: torch.Tensor, theta_log: torch.Tensor,
         br: torch.Tensor, bi: torch.Tensor, *,
         initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
         segment_pos: Optional[torch.Tensor] = None, output_final_state: bool = False,
         strategy: StrategyArg = "auto") -> ScanOutput:
    """The SAMU scan ``h[t] = A[t] h[t-1] + (br[t] + i bi[t])`` (see ``samu_tune.reference``).

    eta, delta: [B, L]; nu_log, theta_log: [M]; br, bi: [B, L, M];
    initial_state: (h0_r, h0_i) each [B, M]; segment_pos: integer [B, L], 0 starts a sequence.
    Returns ``ScanOutput(real, imag, final_state)``: [B, L, M] in br's dtype, and fp32
    (h_r, h_i) [B, M] when ``output_final_state``.  ``strategy`` is ``"auto"``, a registered
    name, or ``(name, config)``.
    """
    inputs = validate(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                      segment_pos=segment_pos, output_final_state=output_final_state)
    problem = problem_of(inputs)
    strat, cfg = resolve(problem, strategy)
    return run(strat, cfg, inputs)


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
