"""The SAMU layer as an op of the registry / tuner / cache / dispatch (issue 7): problem keys,
the layer strategies (unfused, fused, reference) and their eligibility, tuning them on the
interpreter (verified against the float64 layer reference), and ``SAMU(strategy="auto")``
through the rule and a cached winner."""
import pytest
import torch

import samu_tune
import samu_tune.ops.layer.spec  # noqa: F401  (registers the layer op before BUILTIN below)
from samu_tune import cache, dispatch, registry
from samu_tune.ops.layer import fused
from samu_tune.ops.layer.problem import LayerProblem
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.problem import op_of_key, problem_from_key
from samu_tune.settings import settings

from _fakes import env  # noqa: F401  (fixture)

# the real scan and layer strategies, kept before a test's Env swaps the registry
BUILTIN = {s.key: s for op in ("scan", "layer") for s in registry.all_strategies(op)}
SMALL = LayerProblem(B=1, L=40, M=72, dtype="float32", device="cpu", backward=True,
                     resets=True, initial_state=True)
interpreter = pytest.mark.skipif(not settings().interpret,
                                 reason="the fused kernels on CPU need TRITON_INTERPRET=1")


def _builtin(env):
    env.registry.update(BUILTIN)


def test_layer_keys_round_trip_and_never_clash_with_scan_keys():
    p = LayerProblem(B=8, L=4096, M=512, dtype="bfloat16", device="cuda", backward=True,
                     resets=True)
    assert p.key() == "layer:B8-L4096-M512-bf16-train-resets"
    assert p.feature_key() == "layer:bf16-train-resets"
    assert op_of_key(p.key()) == "layer"
    assert problem_from_key(p.key()) == p and LayerProblem.from_key(p.key()) == p
    scan = ScanProblem(**p.model_dump())
    assert scan.key() != p.key() and problem_from_key(scan.key()) == scan
    with pytest.raises(ValueError, match="not a layer problem key"):
        LayerProblem.from_key(scan.key())


def test_layer_strategies_and_reasons():
    names = {s.name for s in registry.all_strategies("layer")}
    assert names == {"unfused", "fused", "reference"}
    assert registry.get("fused", "layer").op == "layer"
    narrow = SMALL.model_copy(update={"M": 8})
    reasons = dict((s.name, r) for s, r in registry.eligible(narrow, None))
    assert any("loop-inner" in r for r in reasons["fused"])
    assert reasons["unfused"] == []
    f64 = SMALL.model_copy(update={"dtype": "float64"})
    reasons = dict((s.name, r) for s, r in registry.eligible(f64, None))
    assert reasons["reference"] == [] and reasons["fused"]


@interpreter
def test_tune_the_layer_verifies_both_paths(env):
    _builtin(env)
    res = samu_tune.tune(SMALL, strategies=["unfused", "fused"], reps=1)
    by = {c.strategy: c for c in res.candidates}
    assert set(by) == {"unfused", "fused"}
    assert all(c.status == "ok" for c in by.values()), [c.reason for c in by.values()]
    # verified in float32 on the small problem, forward and every gradient
    assert by["fused"].verified_on == SMALL.key()
    assert res.winner is not None and res.problem.op == "layer"


@interpreter
def test_a_wrong_fused_layer_fails_verification(env, monkeypatch):
    _builtin(env)
    real = fused.forward

    def off_by_a_bit(*args, **kw):
        y, state = real(*args, **kw)
        return y * 1.01, state
    monkeypatch.setattr(fused, "forward", off_by_a_bit)
    res = samu_tune.tune(SMALL, strategies=["fused"], reps=1)
    assert res.winner is None and "wrong result" in res.candidates[0].reason


@interpreter
def test_auto_layer_uses_the_rule_then_a_cached_winner(env, monkeypatch):
    _builtin(env)
    layer = samu_tune.SAMU(72, generator=torch.Generator().manual_seed(0))
    assert layer.strategy == "auto"
    x = torch.randn(1, 40, 144)
    calls = []
    real = fused.forward

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(fused, "forward", counting)
    fwd = SMALL.model_copy(update={"backward": False, "resets": False, "initial_state": False})
    e = samu_tune.explain(fwd)
    assert (e.strategy, e.source) == ("fused", "rule")
    with torch.no_grad():
        y_rule, _ = layer(x)
    assert calls == [1]
    # a tuned winner in the cache (unfused, forced): the fused path no longer runs
    res = samu_tune.tune(fwd, strategies=["unfused"], reps=1, save=True)
    assert res.winner.strategy == "unfused"
    calls.clear()                       # the tune's own verification and timing calls
    dispatch.clear_memo()
    assert samu_tune.explain(fwd).source == "exact"
    with torch.no_grad():
        y_unfused, _ = layer(x)
    assert calls == []
    assert torch.allclose(y_unfused, y_rule, rtol=1e-4, atol=1e-5)
    assert cache.lookup(fwd) is not None
    # cu_seqlens: always the unfused path, whatever the choice
    cache.clear()
    dispatch.clear_memo()
    with torch.no_grad():
        layer(x, cu_seqlens=torch.tensor([0, 15, 40]))
    assert calls == []


def test_shapes_file_takes_layer_entries(tmp_path):
    from samu_tune.cli.shapes import ShapesError, load_shapes
    f = tmp_path / "shapes.yaml"
    f.write_text("shapes:\n  - {op: layer, B: [1, 2], L: 40, M: 72, dtype: float32, "
                 "resets: true}\n")
    problems = [p for e in load_shapes(f).shapes for p in e.problems("cpu")]
    assert [p.key() for p in problems] == [
        "layer:B1-L40-M72-f32-forward-resets", "layer:B2-L40-M72-f32-forward-resets",
        "layer:B1-L40-M72-f32-train-resets", "layer:B2-L40-M72-f32-train-resets"]
    assert all(isinstance(p, LayerProblem) for p in problems)
    for bad, msg in (("{op: layer, B: 1, M: 5}", "a layer shape needs L"),
                     ("{op: layer, B: 1, L: 4, M: 5, final_state: true}",
                      "a layer shape has no final_state")):
        f.write_text(f"shapes:\n  - {bad}\n")
        with pytest.raises(ShapesError, match=msg):
            load_shapes(f)


def test_cli_lists_the_strategies_of_every_op(capsys):
    import json

    from samu_tune.cli import main
    assert main(["strategies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["op"] for r in rows} >= {"scan", "decode", "layer", "linear"}
    assert main(["strategies", "--op", "layer", "--json"]) == 0
    assert {r["name"] for r in json.loads(capsys.readouterr().out)} == {
        "unfused", "fused", "reference"}
    assert main(["strategies", "--op", "layer"]) == 0
    assert "registered layer strategies" in capsys.readouterr().out
    assert main(["strategies", "--op", "nope"]) != 0
    assert "no such op" in capsys.readouterr().err


@interpreter
@pytest.mark.parametrize("strategy", ["auto", "fused"])
def test_layer_inside_torch_compile(strategy):
    """The layer's choice and the fused kernels run eagerly behind a graph break."""
    layer = samu_tune.SAMU(72, strategy=strategy, generator=torch.Generator().manual_seed(0))
    x = torch.randn(1, 40, 144, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = samu_tune.SAMU(72, strategy="unfused",
                                 generator=torch.Generator().manual_seed(0))(x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: layer(t)[0].sum(dim=-1), backend="eager")
    with torch.no_grad():
        got = compiled(x)
    assert torch.allclose(got, want.sum(dim=-1), rtol=1e-4, atol=1e-4)
