"""Correctness of every registered strategy, generated from the registry.

Each strategy runs on the cases its capability admits (on the CPU: the Triton interpreter),
forward and every gradient against the float64 reference on fresh random inputs, with
poisoned output buffers.  Registering a strategy is enough to be tested here.
"""
import random

import pytest

from samu_tune import registry
from samu_tune.device import device_info
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.verify import verify_strategy

# (B, L, M, dtype, control dtype, backward, resets, h0, final): odd M, L that no chunk size
# divides, L = 1, half precision, bf16 controls, every feature alone and together.
CASES = [
    (2, 7, 5, "float32", "float32", True, False, False, False),
    (2, 19, 24, "bfloat16", "float32", True, True, True, True),
    (1, 33, 40, "float32", "float32", True, False, True, True),
    (3, 5, 1, "float16", "float32", False, True, False, False),
    (2, 70, 17, "float32", "float32", True, True, False, True),
    (2, 12, 8, "bfloat16", "bfloat16", True, False, False, True),
    (1, 1, 3, "float32", "float32", True, False, True, True),
    (2, 9, 6, "float64", "float64", True, True, True, True),
]


def _problem(case, device="cpu") -> ScanProblem:
    B, L, M, dt, ct, bwd, resets, h0, final = case
    return ScanProblem(B=B, L=L, M=M, dtype=dt, control_dtype=ct, device=device, backward=bwd,
                       resets=resets, initial_state=h0, final_state=final)


def _params():
    out = []
    for device in ("cpu", "cuda"):
        dev = device_info(device) if device == "cpu" else None
        marks = [pytest.mark.gpu] if device == "cuda" else []
        for strat in registry.all_strategies():
            for case in CASES:
                problem = _problem(case, device)
                if dev is None:  # on the GPU every Triton strategy must run every CUDA case
                    runnable = not strat.capability.reasons(problem)
                else:
                    runnable = not strat.reasons(problem, dev)
                if runnable:
                    out.append(pytest.param(strat.name, problem, marks=marks,
                                            id=f"{device}-{strat.name}-{problem.key()}"))
    return out


@pytest.mark.parametrize("name,problem", _params())
def test_default_config_matches_reference(name, problem):
    strat = registry.get(name)
    cfg = strat.default_config(problem)
    for seed in (0, 1):
        failure = verify_strategy(strat, cfg, problem, seed=seed)
        assert failure is None, f"{name} {cfg!r} seed {seed}: {failure}"


def _config_params(per_strategy: int = 6):
    dev = device_info("cpu")
    problem = ScanProblem(B=2, L=37, M=20, dtype="float32", device="cpu", backward=True,
                          resets=True, initial_state=True, final_state=True)
    out = []
    for strat in registry.all_strategies():
        if strat.reasons(problem, dev):
            continue
        configs = strat.configs(problem)
        rng = random.Random(strat.name)
        picked = configs if len(configs) <= per_strategy else rng.sample(configs, per_strategy)
        for cfg in picked:
            out.append(pytest.param(strat.name, cfg.model_dump(), problem,
                                    id=f"{strat.name}-{sorted(cfg.model_dump().items())}"))
    return out


@pytest.mark.parametrize("name,config,problem", _config_params())
def test_sampled_configs_match_reference(name, config, problem):
    strat = registry.get(name)
    cfg = strat.parse_config(config)
    failure = verify_strategy(strat, cfg, problem, seed=7)
    assert failure is None, f"{name} {cfg!r}: {failure}"


def test_every_strategy_has_a_case():
    """Every strategy runs some case on the CPU; one that cannot run under the interpreter
    (a Gluon kernel) some CUDA case, and says why it skips the CPU."""
    dev = device_info("cpu")
    for strat in registry.all_strategies():
        runnable = [c for c in CASES if not strat.reasons(_problem(c), dev)]
        if not strat.capability.interpreter:
            assert not runnable
            assert any("interpreter" in r for r in strat.reasons(_problem(CASES[1]), dev))
            runnable = [c for c in CASES if not [
                r for r in strat.capability.reasons(_problem(c, "cuda"))
                if "interpreter" not in r]]
        assert runnable, f"{strat.name} runs none of the generated cases on the CPU"
