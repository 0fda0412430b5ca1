"""A strategy added as one module in the scan's strategies folder is found by everything that
reads the registry: the generated correctness tests, the tuner, the CLI and explain."""
from __future__ import annotations

import io
import sys
import textwrap

import pytest

from samu_tune import registry
from samu_tune.ops.scan import strategies
from samu_tune.ops.scan.api import explain
from samu_tune.ops.scan.problem import ScanProblem

MODULE = textwrap.dedent('''
    """Strategy ``newcomer``: the float64 reference in the inputs' dtypes (a test's strategy)."""
    import sys

    from samu_tune.ops.scan.capability import Capability
    from samu_tune.ops.scan.strategies import reference
    from samu_tune.registry import Strategy, register

    STRATEGY = register(Strategy(
        name="newcomer", description="a strategy written as one module",
        capability=Capability(devices=frozenset({"cpu", "cuda"}), triton=False),
        run=reference.run, modules=(sys.modules[__name__],)))
''')


@pytest.fixture
def newcomer(tmp_path):
    (tmp_path / "newcomer.py").write_text(MODULE)
    strategies.__path__.append(str(tmp_path))
    try:
        assert "newcomer" in strategies.load()
        yield registry.get("newcomer")
    finally:
        strategies.__path__.remove(str(tmp_path))
        registry.unregister("newcomer")
        sys.modules.pop(f"{strategies.__name__}.newcomer", None)


def test_a_strategy_module_is_picked_up(newcomer, capsys):
    import test_strategies
    from samu_tune import tune
    from samu_tune.cli import main

    problem = ScanProblem(B=2, L=19, M=24, dtype="float32", device="cpu", resets=True,
                          initial_state=True, final_state=True)
    # the generated correctness tests
    assert any(p.values[0] == "newcomer" for p in test_strategies._params())
    test_strategies.test_default_config_matches_reference("newcomer", problem)
    # the tuner
    result = tune(problem, strategies=["newcomer"], save=False)
    assert result.winner is not None and result.winner.strategy == "newcomer"
    # explain and the CLI
    assert "newcomer" in {r.name for r in explain(problem).strategies}
    assert main(["strategies"]) == 0
    assert "newcomer" in capsys.readouterr().out
