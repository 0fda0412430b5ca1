"""``samu_tune.scan``: validate -> ScanProblem -> the memoized dispatch decision -> run it.

The choice itself (cache, nearest key, shipped table, rules, online tuning, the distributed
broadcast) is :mod:`samu_tune.dispatch`'s; this module builds the scan's problem from its
tensors and runs the chosen strategy, or, under torch.compile, the scan's operators
(:mod:`samu_tune.ops.scan.library`), which decide inside.
"""
from __future__ import annotations

from typing import Optional

import torch
from pydantic import BaseModel

from samu_tune import dispatch, registry
from samu_tune.dispatch import Decision, StrategyArg
from samu_tune.explanation import Explanation, explain_problem
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.tensors import ScanInputs, ScanOutput
from samu_tune.ops.scan.validation import validate
from samu_tune.library import disable_dynamo, is_compiling
from samu_tune.problem import problem_types
from samu_tune.registry import Strategy
from samu_tune.settings import settings


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


def decide(inputs: ScanInputs, strategy: StrategyArg, backward: Optional[bool] = None
           ) -> Decision:
    """The scan's memoized decision for validated ``inputs`` (``backward``: see
    :func:`_fast_key`; the scan's operators pass it, their tensors carry no autograd state);
    under ``torch.distributed`` rank 0's decision (:func:`samu_tune.dispatch.decide`)."""
    return dispatch.decide(_fast_key(inputs, backward), lambda: problem_of(inputs, backward),
                           inputs.br.device, strategy, broadcast=True)


# torch.compile must not trace the decision (it reads files, clocks and a memo): under
# compilation scan calls the operators of samu_tune.ops.scan.library, which decide inside.


def scan(eta: torch.Tensor, delta: torch.Tensor, nu_log: torch.Tensor, theta_log: torch.Tensor,
         br: torch.Tensor, bi: torch.Tensor, *,
         initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
         segment_pos: Optional[torch.Tensor] = None, output_final_state: bool = False,
         strategy: StrategyArg = "auto") -> ScanOutput:
    """The SAMU scan ``h[t] = A[t] h[t-1] + (br[t] + i bi[t])`` (see ``samu_tune.ops.scan.reference``).

    eta, delta: [B, L]; nu_log, theta_log: [M]; br, bi: [B, L, M];
    initial_state: (h0_r, h0_i) each [B, M]; segment_pos: integer [B, L], 0 starts a sequence.
    Returns ``ScanOutput(real, imag, final_state)``: [B, L, M] in br's dtype, and fp32
    (h_r, h_i) [B, M] when ``output_final_state``.  ``strategy`` is ``"auto"`` (the dispatch
    policy, see :mod:`samu_tune.dispatch`), a registered name, or ``(name, config)``.
    Under torch.compile the kernels run as the operators ``samu_tune::scan_fwd`` /
    ``scan_bwd`` (:mod:`samu_tune.ops.scan.library`: no graph break, CUDA-graph capturable); float64
    inputs and CPU tensors without the Triton interpreter trace the torch reference.  Any of
    B, L, M may be 0: empty outputs, and the final state is the initial state (or zeros).
    """
    if is_compiling():
        return _scan_traced(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                            output_final_state, strategy)
    return _scan(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                 output_final_state, strategy)


def _scan(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
          output_final_state, strategy) -> ScanOutput:
    inputs = validate(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                      segment_pos=segment_pos, output_final_state=output_final_state)
    if not inputs.br.numel():
        _check_strategy(strategy)
        return _reference(inputs, empty=True)
    decision = decide(inputs, strategy)
    return run(decision.strategy, decision.config, inputs)


def _check_strategy(strategy: StrategyArg, *, traced: bool = False) -> None:
    """A strategy argument checked without a problem (an empty input has none): a registered
    name, or (name, config) whose config parses; the errors :func:`scan` raises otherwise.
    ``traced``: in code dynamo traces whole, a config dict's keys among the strategy's config
    fields instead of a parse (the values are checked where the strategy runs: the operators
    parse the config; the reference paths run no strategy, so without this a misspelled
    strategy would pass unnoticed there)."""
    if strategy == "auto":
        return
    name, config = dispatch.split_strategy(strategy)
    strat = registry.get(name)
    if traced:
        if isinstance(config, dict):
            strat.check_fields(config)
    elif config is not None:
        strat.parse_config(config)


def _reference(inputs: ScanInputs, empty: bool = False) -> ScanOutput:
    """The torch reference on validated inputs: float64, CPU tensors without the interpreter
    under torch.compile, and empty inputs (``empty``: B, L or M = 0; no kernel, no dispatch;
    empty outputs, the final state the initial one, or zeros, in the dtype a kernel's would
    have: float64 only when the scan's inputs are, whatever h0's dtype)."""
    from samu_tune.ops.scan.reference import scan_reference
    dtype = None
    if empty:
        wide = (inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log, inputs.br, inputs.bi)
        dtype = (torch.float64 if any(t.dtype == torch.float64 for t in wide)
                 else torch.float32)
    return scan_reference(inputs.eta, inputs.delta, inputs.nu_log, inputs.theta_log, inputs.br,
                          inputs.bi, initial_state=inputs.initial_state,
                          segment_pos=inputs.segment_pos,
                          output_final_state=inputs.output_final_state, dtype=dtype)


def _scan_traced(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                 output_final_state, strategy) -> ScanOutput:
    """:func:`scan` under torch.compile: validation traced, the kernels as operators."""
    from samu_tune.library import strategy_string
    from samu_tune.ops.scan import library
    inputs = validate(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                      segment_pos=segment_pos, output_final_state=output_final_state)
    _check_strategy(strategy, traced=True)
    if (strategy == "reference" or inputs.br.dtype == torch.float64
            or inputs.eta.dtype == torch.float64 or inputs.nu_log.dtype == torch.float64
            or (not inputs.br.is_cuda and not settings().interpret)):
        return _reference(inputs)
    if not inputs.br.numel():
        return _reference(inputs, empty=True)
    if not library.operators_serve(strategy_string(strategy)):
        return _scan_eager(eta, delta, nu_log, theta_log, br, bi, initial_state, segment_pos,
                           output_final_state, strategy)
    return library.scan(inputs, strategy)


# a strategy without an autograd Function (one registered from outside) runs eagerly behind a
# graph break under torch.compile: the operators cannot split its forward from its backward
_scan_eager = disable_dynamo(_scan)


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




def explain(*args, strategy: StrategyArg = "auto", policy: Optional[str] = None,
            **kwargs) -> Explanation:
    """Explain dispatch for ``explain(problem)`` (of any op: a :class:`ScanProblem`, a
    ``DecodeProblem``, ...) or ``explain(<the arguments of scan>)``; never tunes."""
    if len(args) == 1 and not kwargs and isinstance(args[0], tuple(problem_types().values())):
        return explain_problem(args[0], strategy=strategy, policy=policy)
    inputs = validate(*args, **kwargs)
    if not inputs.br.numel():
        raise ValueError(f"nothing to explain for br of shape {list(inputs.br.shape)}: with "
                         "B, L or M = 0 scan runs the torch reference (no dispatch, no kernel)")
    return explain_problem(problem_of(inputs), strategy=strategy, policy=policy,
                                    device=inputs.br.device)
