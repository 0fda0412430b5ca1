"""The tuner on fake strategies with known costs (CPU, fake clock unless a test sleeps)."""
import time

import pytest
import torch
from triton.runtime.errors import OutOfResources

import samu_tune
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.spec import verification_problem
from samu_tune.results import TuneResult

from _fakes import (  # noqa: F401  (fixtures)
    Grid3Config, GridConfig, clock, coupled_cost, env, fake, grid3_cost, grid_cost)

FWD = ScanProblem(B=2, L=6, M=4, dtype="float32", device="cpu", backward=False)
TRAIN = ScanProblem(B=2, L=5, M=3, dtype="float32", device="cpu", backward=True,
                    initial_state=True, final_state=True)


def _by_name(result: TuneResult):
    return {c.name: c for c in result.candidates}


def test_picks_the_fastest_fake_with_margin(env, clock):
    env.add(fake("fast", 1.0), fake("mid", 2.0), fake("slow", 4.0))
    result = samu_tune.tune(TRAIN, strategies=["fast", "mid", "slow"], reps=3)
    assert result.winner.strategy == "fast"
    assert result.winner.time_ms == pytest.approx(1.0)
    assert result.runner_up.strategy == "mid"
    assert result.margin == pytest.approx(1.0)
    assert result.timing == "cpu-wall" and result.cpu_wall_time
    assert result.mode == "train" and result.problem.backward
    assert [c.strategy for c in result.ranked()] == ["fast", "mid", "slow"]
    # the top three were re-timed interleaved on top of their first samples
    assert all(c.samples > 3 for c in result.ranked())
    assert "winner    fast" in result.summary()
    # the result round-trips through JSON (the CLI may save it)
    assert TuneResult.model_validate_json(result.model_dump_json()) == result


def test_real_sleeps_rank_the_same(env):
    env.add(fake("sleep2", 2.0, sleep=True), fake("sleep9", 9.0, sleep=True))
    result = samu_tune.tune(FWD, strategies=["sleep2", "sleep9"], reps=3, retime_rounds=3)
    assert result.winner.strategy == "sleep2"
    assert 2.0 <= result.winner.time_ms < 9.0 <= result.runner_up.time_ms


def test_failing_candidates_are_recorded_and_never_win(env, clock):
    env.add(
        fake("raises", 0.1, raises=lambda: RuntimeError("boom")),
        fake("wrong", 0.2, wrong=True),
        fake("oor", 0.3, raises=lambda: OutOfResources(300000, 232448, "shared memory")),
        # verification passes on the small problem (B <= 2), the real shape (B = 3) raises
        fake("big_fails", 0.4, raises=lambda: RuntimeError("grid too large"),
             raises_if=lambda inp: inp.br.shape[0] > 2),
        fake("good", 5.0))
    problem = ScanProblem(B=3, L=6, M=4, dtype="float32", device="cpu", backward=True)
    result = samu_tune.tune(problem, strategies=["raises", "wrong", "oor", "big_fails", "good"],
                            reps=2)
    assert result.winner.strategy == "good"
    assert result.runner_up is None
    c = _by_name(result)
    assert c["raises"].status == "failed" and "RuntimeError: boom" in c["raises"].reason
    assert c["wrong"].status == "failed" and "wrong result" in c["wrong"].reason
    assert "real: relative error" in c["wrong"].reason
    assert "OutOfResources" in c["oor"].reason
    assert c["big_fails"].status == "failed" and "timing raised" in c["big_fails"].reason
    assert c["big_fails"].verified_on.startswith("B2-")
    assert len(result.failed()) == 4


def test_wrong_gradient_only_is_caught_in_train_mode(env, clock):
    from samu_tune.ops.scan.strategies import reference as ref

    def bad_grad(inputs, cfg):  # forward right, an extra term in br's gradient
        out = ref.run(inputs, cfg)
        real = out.real + (inputs.br - inputs.br.detach())
        return samu_tune.ScanOutput(real, out.imag, out.final_state)
    good = fake("bad_grad", 0.1)
    object.__setattr__(good, "run", bad_grad)
    env.add(good)
    train = samu_tune.tune(TRAIN, strategies=["bad_grad", "reference"], reps=1)
    assert train.winner.strategy == "reference"
    assert "grad_br" in _by_name(train)["bad_grad"].reason
    fwd = samu_tune.tune(TRAIN, mode="forward", strategies=["bad_grad"], reps=1)
    assert fwd.winner.strategy == "bad_grad" and fwd.mode == "forward"
    assert not fwd.problem.backward


def test_deterministic_mode_filters_atomics(env, clock):
    env.add(fake("atomic", 0.5, deterministic=False), fake("exact", 1.0))
    names = ["atomic", "exact"]
    free = samu_tune.tune(FWD, strategies=names, reps=1)
    assert free.winner.strategy == "atomic"
    det = samu_tune.tune(FWD.model_copy(update={"deterministic": True}), strategies=names, reps=1)
    assert det.winner.strategy == "exact"
    assert "atomic" in det.ineligible and "deterministic" in det.ineligible["atomic"][0]
    assert all(c.strategy != "atomic" for c in det.candidates)
    torch.use_deterministic_algorithms(True)
    try:
        under = samu_tune.tune(FWD, strategies=names, reps=1)
    finally:
        torch.use_deterministic_algorithms(False)
    assert under.problem.deterministic and under.winner.strategy == "exact"


def test_refine_finds_the_exhaustive_optimum_with_fewer_configs(env, clock):
    env.add(fake("grid", grid3_cost, config_model=Grid3Config), fake("flat", 1.5))
    names = ["grid", "flat"]
    events = []
    refine = samu_tune.tune(FWD, strategies=names, reps=1, progress=events.append)
    full = samu_tune.tune(FWD, strategies=names, reps=1, exhaustive=True)
    assert full.search == "exhaustive" and len(full.candidates) == 37
    for result in (refine, full):
        assert (result.winner.strategy, result.winner.config) == (
            "grid", {"a": 2, "b": 1, "c": 1})
        assert result.winner.time_ms == pytest.approx(1.0)
        assert result.runner_up.time_ms == pytest.approx(1.5)
    assert len(refine.candidates) < len(full.candidates)
    phases = [c.phase for c in refine.candidates]
    assert phases[:2] == ["screen", "screen"] and set(phases[2:]) == {"refine"}
    # progress: a start and a finish per evaluated candidate, then the re-timed ones
    starts = [e for e in events if e.event == "start"]
    assert len(starts) == len(refine.candidates)
    assert all(1 <= e.index <= e.total for e in events)
    assert [e.elapsed_s for e in events] == sorted(e.elapsed_s for e in events)
    assert {e.phase for e in events} == {"screen", "refine", "retime"}
    finish = [e for e in events if e.event == "finish" and e.phase != "retime"]
    assert [e.candidate for e in finish] == [c.name for c in refine.candidates]
    assert finish[0].candidate == "grid[a=0,b=0,c=0]" and finish[0].time_ms == pytest.approx(4.0)


def test_patience_stops_refining_once_nothing_gains(env, clock):
    # a flat space: the screen's default is as good as it gets, every refinement ties
    env.add(fake("flat3", lambda cfg: 2.0, config_model=Grid3Config))
    result = samu_tune.tune(FWD, strategies=["flat3"], reps=1, patience=3)
    assert result.stopped == "converged"
    assert [c.phase for c in result.candidates] == ["screen", "refine", "refine", "refine"]
    unlimited = samu_tune.tune(FWD, strategies=["flat3"], reps=1)
    assert unlimited.stopped is None and len(unlimited.candidates) > 4
    # a gain of more than 1% resets the count: the descent still reaches the optimum
    env.add(fake("grid3", grid3_cost, config_model=Grid3Config))
    found = samu_tune.tune(FWD, strategies=["grid3"], reps=1, patience=3)
    assert found.winner.config == {"a": 2, "b": 1, "c": 1}
    full = samu_tune.tune(FWD, strategies=["grid3"], reps=1)
    assert len(found.candidates) < len(full.candidates)
    # exhaustive ignores it
    every = samu_tune.tune(FWD, strategies=["flat3"], reps=1, patience=1, exhaustive=True)
    assert every.stopped is None and len(every.candidates) == 36


def test_refine_tries_two_fields_at_once(env, clock):
    env.add(fake("coupled", coupled_cost, config_model=GridConfig))
    result = samu_tune.tune(FWD, strategies=["coupled"], reps=1)
    assert result.winner.config == {"a": 3, "b": 2}
    assert result.winner.time_ms == pytest.approx(1.0)


def _gated_valid(problem, cfg) -> bool:
    """b > 0 only with a = 0 (as the look-back's width 8 needs one row per step)."""
    return cfg.b == 0 or cfg.a == 0


def _gated_cost(cfg) -> float:
    """1.0 ms at a = 0, b = 2 only; elsewhere the default a = 3 is the best and every step
    away from it loses."""
    return 1.0 if (cfg.a, cfg.b) == (0, 2) else 2.0 + 0.1 * (3 - cfg.a) + 0.1 * cfg.c


def test_refine_reaches_values_invalid_one_field_away(env, clock):
    # from the default (3, 0, 0) no one-field step reaches b > 0 (it needs a = 0 too): the
    # line of b holds the configs that change one field more, so the optimum is found
    # before the patience stop ends the search
    env.add(fake("gated", _gated_cost, config_model=Grid3Config, valid=_gated_valid,
                 default=lambda problem: Grid3Config(a=3)))
    result = samu_tune.tune(FWD, strategies=["gated"], reps=1, patience=6)
    assert result.winner.config == {"a": 0, "b": 2, "c": 0}
    assert result.winner.time_ms == pytest.approx(1.0)
    assert len(result.candidates) < 18          # the valid space


def test_the_reference_is_a_fallback(env, clock):
    env.add(fake("good", 2.0))
    both = samu_tune.tune(FWD, strategies=["good", "reference"], reps=1)
    assert [c.strategy for c in both.candidates] == ["good"]
    env.add(fake("broken", 1.0, raises=lambda: RuntimeError("boom")))
    alone = samu_tune.tune(FWD, strategies=["broken", "reference"], reps=1)
    assert [c.strategy for c in alone.candidates][-1] == "reference"
    assert alone.winner.strategy == "reference"


def test_max_configs_caps_the_search(env, clock):
    env.add(fake("grid", grid_cost, config_model=GridConfig))
    result = samu_tune.tune(FWD, strategies=["grid"], reps=1, max_configs=3)
    assert len(result.candidates) == 3 and result.stopped == "max_configs"
    assert result.winner is not None
    full = samu_tune.tune(FWD, strategies=["grid"], reps=1, max_configs=4, exhaustive=True)
    timed = [c for c in full.candidates if c.status != "skipped"]
    assert len(timed) == 4 and len(full.candidates) == 12
    assert all("max_configs" in c.reason for c in full.candidates if c.status == "skipped")


def test_budget_stops_starting_candidates(env):
    env.add(fake("slowgrid", 30.0, config_model=GridConfig, sleep=True))
    t0 = time.monotonic()
    result = samu_tune.tune(FWD, strategies=["slowgrid"], reps=1, budget_s=0.15,
                            exhaustive=True)
    took = time.monotonic() - t0
    timed = [c for c in result.candidates if c.status == "ok"]
    assert result.stopped == "budget_s"
    assert 1 <= len(timed) <= 3 and len(result.candidates) == 12
    assert took < 2.0


def test_ineligible_and_restricted(env, clock):
    env.add(fake("fwd_only", 0.1, backward=False), fake("ok", 1.0))
    result = samu_tune.tune(TRAIN, strategies=["fwd_only", "ok"], reps=1)
    assert result.ineligible == {"fwd_only": ["no backward"]}
    assert result.winner.strategy == "ok"
    with pytest.raises(ValueError, match="mode must be"):
        samu_tune.tune(TRAIN, mode="both")
    with pytest.raises(ValueError, match="unknown strategy"):
        samu_tune.tune(TRAIN, strategies=["nope"])


def test_verification_problem_is_small_unless_the_config_needs_the_real_shape(env):
    big = ScanProblem(B=8, L=4100, M=200, dtype="bfloat16", device="cpu", resets=True)
    anything = fake("anything")
    small = verification_problem(big, anything, anything.default_config(big))
    assert (small.B, small.L, small.M) == (2, 256 + 4100 % 64, 32 + 200 % 32)
    assert small.feature_key() == big.feature_key()
    needs_m = fake("needs_m", valid=lambda p, cfg: p.M == 200)
    v = verification_problem(big, needs_m, needs_m.default_config(big))
    assert (v.B, v.L, v.M) == (2, 260, 200)
    # a config that needs many chunks: L doubled (tail kept) until valid, not the real L
    needs_l = fake("needs_l", valid=lambda p, cfg: p.L >= 1000)
    v = verification_problem(big, needs_l, needs_l.default_config(big))
    assert (v.B, v.L, v.M) == (2, 1024 + 4100 % 64, 32 + 200 % 32)
    needs_long = fake("needs_long", valid=lambda p, cfg: p.L >= 4000 and p.M == 200)
    v = verification_problem(big, needs_long, needs_long.default_config(big))
    assert (v.B, v.L, v.M) == (2, 4100, 200)
    needs_all = fake("needs_all", valid=lambda p, cfg: p.L == 4100 and p.B == 8)
    assert verification_problem(big, needs_all, needs_all.default_config(big)) == big
    tiny = ScanProblem(B=1, L=7, M=64, device="cpu")
    assert verification_problem(tiny, anything, anything.default_config(tiny)) == tiny


def test_save_stores_the_winner(env, clock):
    env.add(fake("fast", 1.0), fake("slow", 2.0))
    result = samu_tune.tune(FWD, strategies=["fast", "slow"], reps=1, save=True)
    entry = samu_tune.cache.lookup(FWD, result.device.signature())
    assert entry.strategy == "fast" and entry.runner_up.strategy == "slow"
    assert entry.cpu_wall_time and entry.mode == "forward"


def test_a_neighbours_winner_is_timed_first(env, clock):
    env.add(fake("grid", grid3_cost, config_model=Grid3Config), fake("flat", 1.5))
    names = ["grid", "flat"]
    neighbour = FWD.model_copy(update={"L": 4 * FWD.L})
    first = samu_tune.tune(neighbour, strategies=names, reps=1, save=True)
    assert first.winner.config == {"a": 2, "b": 1, "c": 1}
    assert all(c.phase != "prior" for c in first.candidates)  # nothing tuned before it
    # with room for a single candidate, the neighbour's winner is the one evaluated
    one = samu_tune.tune(FWD, strategies=names, reps=1, max_configs=1)
    assert [(c.phase, c.strategy, c.config) for c in one.candidates] == [
        ("prior", "grid", {"a": 2, "b": 1, "c": 1})]
    assert one.stopped == "max_configs"
    full = samu_tune.tune(FWD, strategies=names, reps=1)
    assert full.candidates[0].phase == "prior"
    assert full.winner.config == {"a": 2, "b": 1, "c": 1}
    # refinement starts from the prior (the optimum): only its neighbours are evaluated
    assert len(full.candidates) < len(first.candidates)
    # a prior the problem's space does not hold is not timed: "flat" is not among the names
    only_flat = samu_tune.tune(FWD, strategies=["flat"], reps=1)
    assert [c.phase for c in only_flat.candidates] == ["screen"]


def test_the_float64_reference_runs_once_per_verification_problem(env, clock, monkeypatch):
    import dataclasses

    from samu_tune import opspec
    calls = []
    spec = opspec.get("scan")

    def counting(inputs, problem, **kw):
        calls.append(problem.key())
        return spec.expected(inputs, problem, **kw)
    monkeypatch.setitem(opspec._SPECS, "scan", dataclasses.replace(spec, expected=counting))
    env.add(fake("a", 1.0), fake("b", 2.0), fake("c", 3.0, wrong=True))
    result = samu_tune.tune(TRAIN, strategies=["a", "b", "c"], reps=1)
    assert len(result.candidates) == 3 and len(calls) == 1
    # a wrong candidate is still caught against the shared reference
    assert _by_name(result)["c"].status == "failed"


def test_a_verification_pass_is_reused_by_another_shape(env, clock):
    """Two shapes verified on the same small problem: the second tune reads the first's pass
    (also in a fresh process: it is on disk); a failure is verified again; the store is
    keyed by the strategy's source hash."""
    import dataclasses
    import sys
    from samu_tune import verified
    env.set_env(SAMU_TUNE_VERIFY_CACHE="1")
    this = (sys.modules[__name__],)     # a strategy's code identity: the modules it lists
    env.add(dataclasses.replace(fake("good", 1.0), modules=this),
            dataclasses.replace(fake("wrong", 0.5, wrong=True), modules=this),
            fake("anonymous", 2.0))
    a = ScanProblem(B=4, L=700, M=96, dtype="float32", device="cpu", backward=False)
    b = a.model_copy(update={"B": 3, "L": 1340})     # both verified at (2, 316, 64)
    first = _by_name(samu_tune.tune(a, strategies=["good", "wrong", "anonymous"], reps=2))
    second = _by_name(samu_tune.tune(b, strategies=["good", "wrong", "anonymous"], reps=2))
    assert first["good"].verified_on == second["good"].verified_on
    assert first["good"].verified_in is None and second["good"].verified_in == "cache"
    assert second["good"].status == "ok"
    assert second["wrong"].verified_in is None and second["wrong"].status == "failed"
    # no modules listed, no code identity: verified every time
    assert second["anonymous"].verified_in is None and second["anonymous"].status == "ok"
    # on disk: a new process (the in-process memory dropped) reads it
    verified._MEMORY.clear()
    verified._LOADED.clear()
    third = _by_name(samu_tune.tune(b, strategies=["good"], reps=2))
    assert third["good"].verified_in == "cache"
    # another source hash (an edited strategy) is verified again
    env.registry["good"]._hash[:] = ["0" * 16]
    fourth = _by_name(samu_tune.tune(b, strategies=["good"], reps=2))
    assert fourth["good"].verified_in is None
    # a corrupt or foreign file is not an error: verified again, the file replaced
    for text in ("[]", '{"format": 1, "verdicts": {"x": null}}', "not json"):
        verified._MEMORY.clear()
        verified._LOADED.clear()
        verified.path("cpu-interpreter").write_text(text)
        again = _by_name(samu_tune.tune(b, strategies=["good"], reps=2))["good"]
        assert again.status == "ok" and again.verified_in is None
    # switched off: verified every time
    env.set_env(SAMU_TUNE_VERIFY_CACHE="0")
    assert _by_name(samu_tune.tune(a, strategies=["good"], reps=2))["good"].verified_in is None


def test_a_train_tune_starts_from_the_same_shapes_forward_entry(env, clock):
    env.add(fake("grid", grid3_cost, config_model=Grid3Config), fake("flat", 1.5))
    names = ["grid", "flat"]
    forward = samu_tune.tune(FWD, strategies=names, reps=1, save=True)
    entry = samu_tune.cache.lookup(FWD, forward.device.signature())
    picks = [(entry.strategy, entry.config), (entry.runner_up.strategy, entry.runner_up.config)]
    train = samu_tune.tune(FWD.model_copy(update={"backward": True}), strategies=names, reps=1)
    assert [(c.strategy, c.config) for c in train.candidates[:2]] == picks
    assert [c.phase for c in train.candidates[:2]] == ["prior", "prior"]


def test_the_forward_entry_comes_before_a_neighbour_at_the_same_distance(env, clock):
    env.add(fake("grid", grid3_cost, config_model=Grid3Config), fake("flat", 1.5))
    names = ["grid", "flat"]
    forward = samu_tune.tune(FWD, strategies=names, reps=1, save=True)
    # same B*M and L: distance 0 from FWD in the priors' space; its train winner is "flat"
    twin = FWD.model_copy(update={"B": FWD.B * 2, "M": FWD.M // 2, "backward": True})
    samu_tune.tune(twin, strategies=["flat"], reps=1, save=True)
    train = samu_tune.tune(FWD.model_copy(update={"backward": True}), strategies=names, reps=1)
    assert (train.candidates[0].strategy, train.candidates[0].config) == (
        forward.winner.strategy, forward.winner.config)
