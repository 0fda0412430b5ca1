"""The tuner's compile pool (samu_tune.compile_pool): workers verify candidates ahead of
timing; a candidate a worker cannot judge is verified by the tuning process."""
from __future__ import annotations

import sys

import pytest

from samu_tune import compile_pool, registry, tune
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.settings import settings

PROBLEM = ScanProblem(B=2, L=40, M=24, dtype="float32", device="cpu", backward=True)


@pytest.fixture(autouse=True)
def _interpreter():
    if not settings().interpret:
        pytest.skip("the CPU problem needs TRITON_INTERPRET=1")


def test_job_verifies_a_builtin_candidate_and_cannot_judge_an_unknown_one():
    cfg = registry.get("serial").default_config(PROBLEM).model_dump(mode="json")
    status, failure, seconds, on = compile_pool._job(
        "scan", PROBLEM.model_dump(mode="json"), "serial", cfg, 0, "cpu")
    assert status == "verified" and failure is None and seconds > 0
    assert on == "B2-L40-M24-f32-train"
    status, failure, _, _ = compile_pool._job(
        "scan", PROBLEM.model_dump(mode="json"), "no_such_strategy", {}, 0, "cpu")
    assert status == "unknown" and "no_such_strategy" in failure


@pytest.mark.slow
def test_tune_with_workers_matches_tune_without():
    # exhaustive: the candidates' order does not depend on their (CPU, noisy) times
    kw = dict(max_configs=4, strategies=["serial", "lookback"], reps=2, exhaustive=True)
    alone = tune(PROBLEM, compile_workers=0, **kw)
    pooled = tune(PROBLEM, compile_workers=2, **kw)
    evaluated = [c for c in pooled.candidates if c.status != "skipped"]
    assert [(c.name, c.status) for c in pooled.candidates] == \
        [(c.name, c.status) for c in alone.candidates]
    assert all(c.verified_in is None for c in alone.candidates)
    assert evaluated and all(c.verified_in == "worker" for c in evaluated)
    assert all(c.verified_on == a.verified_on
               for c, a in zip(pooled.candidates, alone.candidates))


def test_the_callers_main_module_is_hidden_while_workers_start():
    main = sys.modules["__main__"]
    had_file = "__file__" in main.__dict__
    before = (main.__dict__.get("__file__"), main.__dict__.get("__spec__"))
    with compile_pool._main_hidden():
        assert "__file__" not in main.__dict__ and main.__spec__ is None
    assert ("__file__" in main.__dict__) == had_file
    assert (main.__dict__.get("__file__"), main.__dict__.get("__spec__")) == before


def test_no_pool_unless_asked_for():
    import torch
    from samu_tune.tuner import _compile_pool
    assert compile_pool.suggested_workers(torch.device("cpu")) == 0
    assert _compile_pool(PROBLEM, torch.device("cpu"), 0, None, 10) is None
    assert _compile_pool(PROBLEM, torch.device("cpu"), 0, 2, 1) is None   # one candidate
