"""What the tuner and dispatch need to know about an op beyond its strategies: an :class:`OpSpec`.

An op (the scan, the decode step, ...) is a problem class (``problem.op`` names the op; see
:mod:`samu_tune.problem`), strategies registered with that ``op`` (:mod:`samu_tune.registry`)
and one spec, looked up by :func:`get` from the op name.  The tuner is written against the
spec only: random inputs, a float64 reference computed once per inputs, the comparison with it,
the small problem candidates are verified on, and the timed call.  Dispatch reads ``rules``
(the rule-based choice when nothing tuned applies) and ``relax`` (a neighbouring problem whose
tuned winner is the best guess when this one has none).

Specs are registered by the op's ``spec`` module on import; :data:`samu_tune.ops.BUILTIN` maps
each built-in op to that module, imported on first use.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from samu_tune.ops import BUILTIN


@dataclass(frozen=True, eq=False)
class OpSpec:
    """One op's hooks, for a problem ``p`` of ``problem_type`` (``op`` is its ``op``):

    - ``random_inputs(p, seed=, device=)``: random inputs, the argument of ``strategy.run``;
    - ``expected(inputs, p, seed=)``: the float64 reference's result on them (computed once,
      shared by every candidate verified on the same inputs);
    - ``verify(fn, inputs, p, seed=, reference=)``: None when ``fn(inputs)`` matches
      ``reference`` within :data:`samu_tune.tolerances.TOLERANCES`, else the reasons;
    - ``verification_problem(p, strategy, config, device)``: the (small) problem a candidate is
      verified on before it is timed at ``p``;
    - ``make_step(p, device, pool=, seed=)``: the timed call, a :class:`samu_tune.timing.PoolStep`;
    - ``input_bytes(p)``: bytes of one input set and its outputs (the tuner shrinks the input
      pool when three sets do not fit in half the free memory);
    - ``finite(out)``: whether a run's output is all finite;
    - ``rules``: ``rule(p, eligible strategies) -> (name, why) | None``, first answer wins;
    - ``relax(p) -> (p', label) | None``: a problem whose tuned winner dispatch may use for
      ``p`` (``label`` says how it differs, e.g. "without initial/final state");
    - ``compiles_ahead``: whether a compile worker (:mod:`samu_tune.compile_pool`: CPU
      tensors, every launch compile-only) builds the binaries a candidate's GPU run loads;
      where not, the tuner hands the op's candidates to no compile worker.
    """

    op: str
    problem_type: type
    random_inputs: Callable[..., Any]
    expected: Callable[..., Any]
    verify: Callable[..., Optional[str]]
    verification_problem: Callable[..., Any]
    make_step: Callable[..., Any]
    input_bytes: Callable[[Any], int]
    finite: Callable[[Any], bool]
    rules: list = field(default_factory=list)
    relax: Optional[Callable[[Any], Optional[tuple[Any, str]]]] = None
    compiles_ahead: bool = True


_SPECS: dict[str, OpSpec] = {}


def register_op(spec: OpSpec) -> OpSpec:
    """Add (or replace) the spec of ``spec.op``."""
    _SPECS[spec.op] = spec
    return spec


def get(op: str) -> OpSpec:
    """The spec of ``op`` (importing a built-in op's module on first use)."""
    spec = _SPECS.get(op)
    if spec is None and op in BUILTIN:
        importlib.import_module(BUILTIN[op])
        spec = _SPECS.get(op)
    if spec is None:
        raise ValueError(f"no op spec for {op!r}; known ops: {sorted(set(_SPECS) | set(BUILTIN))}")
    return spec


def ops() -> list[str]:
    """Every op with a spec: the built-in ones (in :data:`BUILTIN`'s order), then any
    registered later."""
    return list(BUILTIN) + sorted(set(_SPECS) - set(BUILTIN))


_LOADED: list[bool] = []


def load_builtin() -> None:
    """Import every built-in op's spec module (registering its spec and strategies); once
    per process (the registry calls this on every lookup)."""
    if _LOADED:
        return
    for module in BUILTIN.values():
        importlib.import_module(module)
    _LOADED.append(True)


def of(problem) -> OpSpec:
    """The spec of ``problem``'s op."""
    return get(problem.op)
