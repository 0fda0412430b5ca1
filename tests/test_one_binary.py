"""A candidate's verification launches the binaries its timing launches: cold tuning compiles
each config once.

The tuner verifies a candidate on a small problem (the op spec's ``verification_problem``)
and times it at the real shape.  Triton compiles a binary per specialisation: pointer dtypes
and 16-byte alignment, ints equal to 1 or divisible by 16 (unless ``do_not_specialize``),
constexprs.  If the small problem specialised differently, every candidate would compile
twice.  Here each launch a candidate makes is recorded as Triton's compiler would see it
(``tools/compile_check``: its signature, constants and divisibility attributes) with the
kernels not run, on the verification problem and on the real one, and the two sets must be
equal.  The layer op verifies in float32 on purpose (``samu_tune/ops/layer/spec.py``), so its
timed bf16 binaries are other binaries; it is not checked here.
"""
import json
import random

import pytest

from samu_tune import opspec, registry
from samu_tune.ops.decode.problem import DecodeProblem
from samu_tune.ops.linear.problem import LinearProblem
from samu_tune.ops.scan.problem import ScanProblem
from tools.compile_check import _signature, recording


def _compile_keys(launches) -> set:
    """Each recorded launch as Triton's compiler sees it: signature, constants, divisibility
    attributes and options."""
    import importlib

    from triton.runtime.jit import JITFunction
    keys = set()
    for launch in launches:
        interpreted = getattr(importlib.import_module(launch["module"]), launch["name"])
        fn = JITFunction(interpreted.fn, **{
            k: v for k, v in interpreted.kwargs.items()
            if k in ("do_not_specialize", "do_not_specialize_on_alignment")})
        sig, const, attrs = _signature(fn, launch)
        keys.add(json.dumps([launch["name"], sig, {k: repr(v) for k, v in const.items()},
                             {repr(k): v for k, v in attrs.items()}, launch["options"]],
                            sort_keys=True))
    return keys


def _launches(spec, problem, strategy, config, *, verification: bool) -> set:
    """The compile keys of a candidate's verification (``spec.verify`` on ``problem``) or of
    its timed call (the op's step at ``problem``)."""
    seen: dict = {}
    fn = lambda inp: strategy.run(inp, config)                    # noqa: E731
    if verification:
        inputs = spec.random_inputs(problem, seed=0, device="cpu")
        reference = spec.expected(inputs, problem, seed=0)
        with recording(seen, execute=False):
            spec.verify(fn, inputs, problem, seed=0, reference=reference)
    else:
        step = spec.make_step(problem, "cpu", pool=1, seed=1000)
        with recording(seen, execute=False):
            step(fn, step.pools[0])
    return _compile_keys(seen.values())


_PROBLEMS = [
    # scan: B, L % 16 and M % 16 differ from the verification problem's
    ScanProblem(B=16, L=320, M=160, dtype="bfloat16", backward=True),
    ScanProblem(B=3, L=777, M=96, dtype="bfloat16", backward=True, initial_state=True,
                final_state=True),
    ScanProblem(B=1, L=640, M=300, dtype="float32", backward=False),
    # grouped's default (16 chunk maps a group) is verified at L 1024 + 2100 % 64, not 256 + ...
    ScanProblem(B=2, L=2100, M=128, dtype="bfloat16", backward=True),
    # linear: n_chunks 1 on the verification problem, a multiple of 16 here
    LinearProblem(B=1, L=1024, D=256, dtype="bfloat16", a_dtype="float32", complex=True),
    LinearProblem(B=16, L=300, D=96, dtype="float32", reverse=True),
    DecodeProblem(B=16, M=96),
]


@pytest.mark.parametrize("problem", _PROBLEMS, ids=lambda p: p.key())
def test_verification_launches_the_binaries_timing_launches(problem):
    spec = opspec.get(problem.op)
    rng = random.Random(0)
    checked = 0
    for strategy in registry.all_strategies(problem.op):
        if strategy.name == "reference" or strategy.reasons(problem):
            continue
        configs = strategy.configs(problem)
        sample = rng.sample(configs, min(2, len(configs)))
        for config in [strategy.default_config(problem), *sample]:
            small = spec.verification_problem(problem, strategy, config)
            if small == problem:
                continue
            want = _launches(spec, problem, strategy, config, verification=False)
            got = _launches(spec, small, strategy, config, verification=True)
            assert want, f"{strategy.name} launched no kernel"
            assert got == want, (
                f"{strategy.name} {config}: verified on {small.key()}, its binaries differ from "
                f"those timed at {problem.key()}: {sorted(got ^ want)[:2]}")
            checked += 1
    assert checked


def test_the_check_tells_two_specialisations_apart():
    # the same config on two problems Triton compiles apart (bf16 vs fp32 pointers)
    spec = opspec.get("scan")
    lookback = registry.get("lookback")
    a = ScanProblem(B=2, L=256, M=64, dtype="bfloat16", backward=True)
    b = a.model_copy(update={"dtype": "float32"})
    config = lookback.default_config(a)
    assert (_launches(spec, a, lookback, config, verification=False)
            != _launches(spec, b, lookback, config, verification=False))
