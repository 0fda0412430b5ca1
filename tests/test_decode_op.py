"""The decode step as an op of the registry / tuner / cache / dispatch (issue 7): problem keys,
per-op registry listing, tuning fakes with known costs and the real kernels (interpreter),
decode entries beside scan entries in one cache file, and ``strategy="auto"`` through the
cache (exact, nearest, rule)."""
import json

import pytest
import torch

import samu_tune
from samu_tune import cache, registry
from samu_tune.intmath import next_power_of_2
from samu_tune.ops.decode import step as decode
from samu_tune.ops.layer import step_reference
from samu_tune.ops.decode.spec import DecodeCapability, _reference_run
from samu_tune.ops.decode.problem import DecodeProblem
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.problem import op_of_key, problem_from_key
from samu_tune.registry import Strategy
from samu_tune.tolerances import check

from _fakes import FakeClock, GridConfig, clock, env, fake, grid_cost  # noqa: F401  (fixtures)

SIG = "cpu-interpreter"
DEC = DecodeProblem(B=3, M=5, dtype="float32", device="cpu")
SCAN = ScanProblem(B=2, L=6, M=4, dtype="float32", device="cpu", backward=False)
# the real decode strategies, kept before a test's Env swaps the registry
BUILTIN_DECODE = {s.key: s for s in registry.all_strategies("decode")}


def _decode_fake(name, cost=1.0, *, config_model=GridConfig, wrong=False, priority=0,
                 costs=None):
    """A decode strategy running the torch reference and costing ``cost(cfg)`` ms on the
    fake clock (``costs``: the clock)."""
    cost_fn = cost if callable(cost) else (lambda cfg, c=cost: c)

    def run(inputs, cfg):
        costs.advance(cost_fn(cfg))
        y, state = _reference_run(inputs, cfg)
        return (y * 1.5 if wrong else y), state

    return Strategy(name=name, description=f"fake decode {name}", run=run,
                    capability=DecodeCapability(devices=frozenset({"cpu", "cuda"}), triton=False),
                    config_model=config_model, priority=priority, op="decode")


def _with_builtin_decode(env):
    env.registry.update(BUILTIN_DECODE)


def _entry(problem, strategy, config, time_ms=1.0):
    strat = registry.get(strategy, problem.op)
    return cache.CacheEntry(key=problem.key(), mode=problem.mode, strategy=strategy,
                            config=config, time_ms=time_ms, source_hash=strat.source_hash,
                            measured_at="2026-01-01", cpu_wall_time=True,
                            versions=dict(cache.versions()))


# ---- problems and the registry ---------------------------------------------------------------

def test_decode_keys_round_trip_and_never_clash_with_scan_keys():
    p = DecodeProblem(B=4, M=1024, dtype="bfloat16", device="cuda")
    assert p.key() == "decode:B4-M1024-bf16-h0"
    assert p.feature_key() == "decode:bf16-h0"
    q = p.model_copy(update={"initial_state": False})
    assert q.key() == "decode:B4-M1024-bf16" and q.feature_key() == "decode:bf16"
    for problem in (p, q, SCAN, ScanProblem(B=8, L=4096, M=512, initial_state=True)):
        assert problem_from_key(problem.key(), device=problem.device) == problem
    assert op_of_key(p.key()) == "decode" and op_of_key(SCAN.key()) == "scan"
    assert SCAN.key() == "B2-L6-M4-f32-forward"  # scan keys unchanged by ops
    for bad in ("decode:B4-M8", "decode:B4-L8-f32", "decode:B4-M8-f32-resets", "nope:B1"):
        with pytest.raises(ValueError):
            problem_from_key(bad)


def test_registry_lists_each_ops_strategies():
    scan_names = {s.name for s in registry.all_strategies()}
    assert {"single", "blocked"}.isdisjoint(scan_names) and "reference" in scan_names
    assert [s.name for s in registry.all_strategies("decode")] == ["single", "blocked",
                                                                   "reference"]
    assert "decode" in registry.ops() and "scan" in registry.ops()
    assert registry.get("reference") is not registry.get("reference", "decode")
    assert registry.get("single", "decode").key == "decode:single"
    with pytest.raises(ValueError, match="unknown strategy 'single'"):
        registry.get("single")
    with pytest.raises(ValueError, match="unknown decode strategy 'lookback'"):
        registry.get("lookback", "decode")
    pairs = registry.eligible(DecodeProblem(B=2, M=8, dtype="float64", device="cpu"))
    reasons = {s.name: r for s, r in pairs}
    assert set(reasons) == {"single", "blocked", "reference"}
    assert reasons["reference"] == []
    assert "dtype float64 not in" in "; ".join(reasons["single"])


def test_explain_lists_decode_strategies_with_reasons(env):
    _with_builtin_decode(env)
    text = str(samu_tune.explain(DecodeProblem(B=2, M=8, dtype="float64", device="cpu")))
    assert "choice: reference" in text and "from rule" in text
    assert "single (priority 10, 0 configs): ineligible: dtype float64" in text
    ex = samu_tune.explain(DecodeProblem(B=2, M=200, dtype="float32", device="cpu"))
    assert ex.strategy == "blocked" and ex.source == "rule"
    assert [r.name for r in ex.strategies] == ["single", "blocked", "reference"]


# ---- the tuner -------------------------------------------------------------------------------

def test_tuner_picks_the_fastest_decode_fake(env, clock):
    env.add(_decode_fake("grid", grid_cost, costs=clock),
            _decode_fake("flat", 1.2, config_model=samu_tune.registry.EmptyConfig, costs=clock),
            _decode_fake("wrong", 0.1, config_model=samu_tune.registry.EmptyConfig, costs=clock,
                         wrong=True))
    result = samu_tune.tune(DEC, reps=2)
    assert result.problem == DEC and result.mode == "forward"
    assert result.winner.strategy == "grid"
    assert result.winner.config == {"a": 2, "b": 1}
    assert result.winner.time_ms == pytest.approx(1.0)
    assert result.runner_up.strategy == "flat"
    wrong = [c for c in result.candidates if c.strategy == "wrong"]
    assert wrong[0].status == "failed" and wrong[0].reason.startswith("wrong result: y:")
    assert all(c.verified_on == "decode:B2-M5-f32-h0" for c in result.candidates)
    assert type(result).model_validate_json(result.model_dump_json()) == result
    with pytest.raises(ValueError, match="forward only"):
        samu_tune.tune(DEC, mode="train")


@pytest.mark.parametrize("problem", [
    DecodeProblem(B=3, M=5, dtype="float32", device="cpu"),
    DecodeProblem(B=1, M=37, dtype="bfloat16", device="cpu", initial_state=False),
])
def test_real_decode_kernels_verify_and_tune(env, problem):
    _with_builtin_decode(env)
    result = samu_tune.tune(problem, strategies=["single", "blocked"], max_configs=6, reps=1,
                            retime_top=0)
    assert not result.failed(), [c.reason for c in result.failed()]
    assert {c.strategy for c in result.ranked()} == {"single", "blocked"}
    assert result.winner is not None and result.cpu_wall_time
    # every evaluated config is valid for the problem (the tiles fit M)
    for c in result.candidates:
        assert c.config["block_m"] <= max(16, next_power_of_2(problem.M))
        assert c.config["block_d"] <= max(64, next_power_of_2(2 * problem.M + 1))


# ---- the cache -------------------------------------------------------------------------------

def test_decode_and_scan_entries_share_one_file(env, clock):
    env.add(fake("fast", 1.0), fake("slow", 3.0),
            _decode_fake("dfast", 1.0, config_model=samu_tune.registry.EmptyConfig, costs=clock),
            _decode_fake("dslow", 2.0, config_model=samu_tune.registry.EmptyConfig, costs=clock))
    scan_entry = cache.record(samu_tune.tune(SCAN, strategies=["fast", "slow"], reps=1))
    dec_entry = cache.record(samu_tune.tune(DEC, reps=1))
    raw = json.loads(cache.path(SIG).read_text())["entries"]
    assert set(raw) == {SCAN.key(), DEC.key()} == {"B2-L6-M4-f32-forward", "decode:B3-M5-f32-h0"}
    assert raw[DEC.key()]["strategy"] == "dfast" and raw[SCAN.key()]["strategy"] == "fast"
    cache.invalidate()  # a new process
    assert cache.lookup(SCAN) == scan_entry and cache.lookup(DEC) == dec_entry
    assert dec_entry.op == "decode" and dec_entry.problem(device="cpu") == DEC
    near = cache.nearest(DEC.model_copy(update={"B": 6}))
    assert [e.key for _, e in near] == [DEC.key()]
    assert near[0][0] == pytest.approx(abs(torch.tensor(6 / 3).log().item()))
    assert cache.nearest(SCAN.model_copy(update={"B": 3}))[0][1].key == SCAN.key()
    assert all(s.served for s in cache.entries())
    # a decode entry whose strategy is gone is listed as not served; the scan entry still is
    env.registry.pop("decode:dfast")
    status = {s.entry.key: s for s in cache.entries()}
    assert status[SCAN.key()].served
    assert status[DEC.key()].reason == "decode strategy 'dfast' is not registered"


def test_an_old_file_with_scan_entries_only_still_loads(env, clock):
    env.add(fake("fast", 1.0))
    entry = cache.record(samu_tune.tune(SCAN, strategies=["fast"], reps=1))
    data = json.loads(cache.path(SIG).read_text())
    data["entries"] = {SCAN.key(): data["entries"][SCAN.key()]}  # as written before ops
    cache.path(SIG).write_text(json.dumps(data))
    cache.invalidate()
    assert cache.lookup(SCAN) == entry
    assert cache.lookup(DEC) is None and cache.nearest(DEC) == []


# ---- dispatch of decode "auto" ---------------------------------------------------------------

def _step_inputs(B, M, seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = samu_tune.SAMU(M, generator=g, phase_amplitude_init=0.8, radial_amplitude_init=-1.1)
    params = decode.SAMUParams(*(p.detach() for p in layer.params()))
    x = torch.randn(B, 2 * M, generator=g)
    state = (torch.randn(B, M, generator=g), torch.randn(B, M, generator=g))
    return x, params, state


def _assert_matches_reference(y, new_state, x, params, state):
    want_y, (wr, wi) = step_reference(x.double(), params.to(torch.float64),
                                      tuple(s.double() for s in state))
    for what, got, want in (("y", y, want_y), ("h_r", new_state[0], wr),
                            ("h_i", new_state[1], wi)):
        assert check(what, got, want, 1e-4) is None


def test_auto_resolves_through_exact_nearest_then_rule(env):
    _with_builtin_decode(env)
    M = 40
    x, params, state = _step_inputs(4, M)
    tuned = DecodeProblem(B=4, M=M, dtype="float32", device="cpu")
    # nothing tuned: today's rule
    d = decode.decision(x, M, state)
    assert d.source == "rule" and d.strategy.name == decode.rule_name(M)
    cfg = {"block_m": 16, "block_d": 64, "num_warps": 2}
    cache.put(_entry(tuned, "single", cfg), SIG)
    d = decode.decision(x, M, state)  # the memo follows the cache file
    assert (d.source, d.strategy.name, d.config.model_dump()) == ("exact", "single", cfg)
    assert decode.choose(x, params, state) == "single"
    x6, _, state6 = _step_inputs(6, M)
    d6 = decode.decision(x6, M, state6)
    assert (d6.source, d6.source_key, d6.strategy.name) == ("nearest", tuned.key(), "single")
    # without a state the features differ (and there is nothing to relax): the rule
    assert decode.decision(x, M, None).source == "rule"
    # the step runs the cached config, once per plan
    dec = decode.Decoder()
    with torch.no_grad():
        y, new_state = dec.step(x, params, state)
        dec.step(x, params, state)
    (plan,) = dec._plans.values()
    assert plan.name == "single" and plan.meta["BLOCK_M"] == 16 and plan.meta["num_warps"] == 2
    _assert_matches_reference(y, new_state, x, params, state)
    # gradients and float64 keep the reference whatever the cache says
    assert decode.choose(x.double(), params, tuple(s.double() for s in state)) == "reference"
    assert decode.choose(x, params.to(torch.float64), state) == "reference"


def test_cached_config_that_cannot_run_falls_through(env):
    _with_builtin_decode(env)
    x, params, state = _step_inputs(2, 5)
    problem = DecodeProblem(B=2, M=5, dtype="float32", device="cpu")
    cache.put(_entry(problem, "blocked", {"block_m": 256, "block_d": 64, "num_warps": 4}), SIG)
    ex = samu_tune.explain(problem)
    assert ex.source == "rule" and ex.strategy == "single"
    assert any("not valid for this problem" in t for t in ex.trail)
    with torch.no_grad():
        y, new_state = decode.decode_step(x, params, state)
    _assert_matches_reference(y, new_state, x, params, state)


def test_state_given_falls_back_to_the_entry_tuned_without_state(env):
    _with_builtin_decode(env)
    x, params, state = _step_inputs(2, 5)
    plain = DecodeProblem(B=2, M=5, dtype="float32", device="cpu", initial_state=False)
    cache.put(_entry(plain, "blocked", {"block_m": 16, "block_d": 64, "num_warps": 1}), SIG)
    d = decode.decision(x, 5, state)
    assert d.strategy.name == "blocked" and d.source == "exact"
    assert d.detail.endswith("(tuned without state)")


# ---- samu-tune profile with decode shapes ----------------------------------------------------

def test_profile_accepts_decode_shapes(env, tmp_path, capsys, monkeypatch):
    from samu_tune.cli import main
    from samu_tune.cli.shapes import ShapesError, load_shapes
    _with_builtin_decode(env)
    monkeypatch.setenv("COLUMNS", "200")
    f = tmp_path / "shapes.yaml"
    f.write_text("shapes:\n  - {op: decode, B: [1, 3], M: 5, dtype: float32}\n"
                 "  - {B: 1, L: 8, M: 4, dtype: float32, mode: forward}\n")
    problems = [p for e in load_shapes(f).shapes for p in e.problems("cpu")]
    assert [p.key() for p in problems] == ["decode:B1-M5-f32-h0", "decode:B3-M5-f32-h0",
                                           "B1-L8-M4-f32-forward"]
    status = main(["profile", "--shapes", str(f), "--quick", "--json", "--device", "cpu",
                   "--strategies", "blocked,reference"])
    out, err = capsys.readouterr()
    assert status == 0, err
    rows = {r["key"]: r for r in json.loads(out)["results"]}
    assert rows["decode:B3-M5-f32-h0"]["strategy"] in ("blocked", "reference")
    assert rows["B1-L8-M4-f32-forward"]["strategy"] == "reference"
    assert cache.lookup(DecodeProblem(B=3, M=5, dtype="float32", device="cpu")) is not None
    for bad, msg in (("{op: decode, B: 1, L: 4, M: 5}", "a decode shape has no L"),
                     ("{op: decode, B: 1, M: 5, mode: train}", "forward only"),
                     ("{B: 1, M: 5}", "a scan shape needs L")):
        f.write_text(f"shapes:\n  - {bad}\n")
        with pytest.raises(ShapesError, match=msg):
            load_shapes(f)
