"""real_scan / complex_scan as an op of the registry / tuner / cache / dispatch (issue 7):
problem keys, strategies and eligibility, tuning serial and chunk on the interpreter (verified
against the float64 loop, gradients included), and ``strategy="auto"`` through the rule and a
cached winner."""
import pytest
import torch

import samu_tune
from samu_tune import dispatch, registry
from samu_tune.ops.linear import spec as linear_op, scan as linear_scan
from samu_tune.ops.linear.problem import LinearProblem
from samu_tune.problem import op_of_key, problem_from_key
from samu_tune.settings import settings

from _fakes import env  # noqa: F401  (fixture)

BUILTIN = {s.key: s for s in registry.all_strategies("linear")}
SMALL = LinearProblem(B=2, L=40, D=20, dtype="float32", complex=True, reverse=True,
                      initial_state=True, backward=True, device="cpu")
interpreter = pytest.mark.skipif(not settings().interpret,
                                 reason="the kernels on CPU need TRITON_INTERPRET=1")


def test_linear_keys_round_trip():
    p = LinearProblem(B=4, L=4096, D=512, dtype="bfloat16", a_dtype="float32", complex=True,
                      reverse=True, initial_state=True, backward=True)
    assert p.key() == "linear:B4-L4096-D512-bf16-af32-complex-train-rev-h0"
    assert p.feature_key() == "linear:bf16-af32-complex-train-rev-h0"
    assert op_of_key(p.key()) == "linear" and problem_from_key(p.key()) == p
    real = LinearProblem(B=1, L=8, D=3, backward=False)
    assert real.key() == "linear:B1-L8-D3-f32-real-forward"
    assert LinearProblem.from_key(real.key()) == real
    with pytest.raises(ValueError, match="not a linear problem key"):
        LinearProblem.from_key("B1-L8-M3-f32-forward")


def test_linear_strategies_and_rule():
    assert {s.name for s in registry.all_strategies("linear")} == {"serial", "chunk",
                                                                    "reference"}
    f64 = SMALL.model_copy(update={"dtype": "float64", "a_dtype": "float64"})
    reasons = dict((s.name, r) for s, r in registry.eligible(f64, None))
    assert reasons["reference"] == [] and reasons["serial"]
    long_ = SMALL.model_copy(update={"L": 4096, "B": 1})
    eligible = [registry.get(n, "linear") for n in ("serial", "chunk")]
    assert linear_op.length_rule(long_, eligible)[0] == "chunk"
    assert linear_op.length_rule(SMALL, eligible)[0] == "serial"


@interpreter
def test_tune_linear_verifies_serial_and_chunk(env):
    env.registry.update(BUILTIN)
    res = samu_tune.tune(SMALL, strategies=["serial", "chunk"], reps=1, max_configs=4)
    assert {c.strategy for c in res.candidates} == {"serial", "chunk"}
    assert all(c.status == "ok" for c in res.candidates), [c.reason for c in res.candidates]
    assert res.winner is not None and res.problem.op == "linear"


@interpreter
def test_a_wrong_linear_strategy_fails_verification(env, monkeypatch):
    env.registry.update(BUILTIN)
    real = linear_scan._scan

    def off(*args, **kw):
        out, last = real(*args, **kw)
        return type(out)(out.r * 1.01, out.i), last
    monkeypatch.setattr(linear_scan, "_scan", off)
    res = samu_tune.tune(SMALL, strategies=["serial"], reps=1, max_configs=1)
    assert res.winner is None and "wrong result" in res.candidates[0].reason


@interpreter
def test_auto_linear_uses_the_rule_then_a_cached_winner(env, monkeypatch):
    env.registry.update(BUILTIN)
    g = torch.Generator().manual_seed(0)
    a = 0.9 * torch.rand(2, 40, 20, generator=g)
    b = torch.randn(2, 40, 20, generator=g)
    fwd = LinearProblem(B=2, L=40, D=20, backward=False, device="cpu")
    e = samu_tune.explain(fwd)
    assert (e.strategy, e.source) == ("serial", "rule")
    seen = []
    real = linear_scan.run if hasattr(linear_scan, "run") else None
    from samu_tune.ops.linear import launch
    real_run = launch.run

    def spy(cfg, **kw):
        seen.append(type(cfg).__name__)
        return real_run(cfg, **kw)
    monkeypatch.setattr(linear_scan, "run", spy)
    with torch.no_grad():
        want = samu_tune.real_scan(a, b).out
    assert seen == ["SerialConfig"]
    res = samu_tune.tune(fwd, strategies=["chunk"], reps=1, max_configs=2, save=True)
    assert res.winner.strategy == "chunk"
    seen.clear()
    dispatch.clear_memo()
    with torch.no_grad():
        got = samu_tune.real_scan(a, b).out
    assert seen == ["ChunkConfig"]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    del real


@interpreter
def test_profile_accepts_linear_shapes(env, tmp_path, capsys, monkeypatch):
    import json

    from samu_tune import cache
    from samu_tune.cli import main
    from samu_tune.cli.shapes import ShapesError, load_shapes
    env.registry.update(BUILTIN)
    monkeypatch.setenv("COLUMNS", "200")
    f = tmp_path / "shapes.yaml"
    f.write_text("shapes:\n  - {op: linear, B: 2, L: [24, 40], D: 20, dtype: float32, "
                 "complex: true, reverse: true, initial_state: true, mode: train}\n")
    problems = [p for e in load_shapes(f).shapes for p in e.problems("cpu")]
    assert [p.key() for p in problems] == ["linear:B2-L24-D20-f32-complex-train-rev-h0",
                                           "linear:B2-L40-D20-f32-complex-train-rev-h0"]
    assert problems[1] == SMALL
    status = main(["profile", "--shapes", str(f), "--quick", "--json", "--device", "cpu",
                   "--strategies", "serial,reference"])
    out, err = capsys.readouterr()
    assert status == 0, err
    rows = {r["key"]: r for r in json.loads(out)["results"]}
    assert rows[SMALL.key()]["strategy"] in ("serial", "reference")
    assert cache.lookup(SMALL) is not None
    for bad, msg in (("{op: linear, B: 1, L: 4, M: 5}", "a linear shape needs D"),
                     ("{op: linear, B: 1, D: 5}", "a linear shape needs L"),
                     ("{op: linear, B: 1, L: 4, D: 5, resets: true}",
                      "a linear shape has no resets"),
                     ("{B: 1, L: 4, M: 5, complex: true}", "a scan shape has no complex"),
                     ("{op: layer, B: 1, L: 4, M: 5, D: 5}", "a layer shape has no D")):
        f.write_text(f"shapes:\n  - {bad}\n")
        with pytest.raises(ShapesError, match=msg):
            load_shapes(f)


def test_copy_bandwidth_of_a_linear_scan():
    from samu_tune.cli import bandwidth
    p = LinearProblem(B=4, L=4096, D=512, dtype="bfloat16", complex=True, backward=False)
    # forward: a (fp32) read, b read and h written (bf16), pairs
    assert bandwidth.moved_bytes(p) == 2 * 4 * 4096 * 512 * (4 + 2 * 2)
    train = p.model_copy(update=dict(backward=True, complex=False))
    assert bandwidth.moved_bytes(train) == 4 * 4096 * 512 * (3 * 4 + 5 * 2)
    assert bandwidth.fraction(p, 1.0, 1e12) == pytest.approx(bandwidth.moved_bytes(p) / 1e9)
