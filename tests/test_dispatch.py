"""Dispatch: every policy path, nearest keys, explain, forced strategies, CUDA-graph guard,
distributed broadcast (gloo), torch.compile, and the host overhead of a cache hit."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import samu_tune
from samu_tune import cache, dispatch, registry, tuner
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.reference import scan_reference
from samu_tune.ops.scan.verify import random_inputs

from _fakes import GridConfig, clock, env, fake, grid_cost  # noqa: F401  (fixtures)

SIG = "cpu-interpreter"
PROBLEM = ScanProblem(B=2, L=16, M=4, dtype="float32", device="cpu", backward=False)


def _put(key, strategy, config=None, *, shipped=False, versions=None, source_hash=None):
    entry = cache.CacheEntry(
        key=key, mode="train" if "-train" in key else "forward", strategy=strategy,
        config=config or {}, time_ms=1.0,
        source_hash=source_hash or registry.get(strategy).source_hash,
        measured_at="2026-01-01", cpu_wall_time=True,
        versions=versions or dict(cache.versions()))
    if not shipped:
        cache.put(entry, SIG)
        return entry
    path = cache.shipped_path(SIG)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (cache.CacheFile.model_validate_json(path.read_text()) if path.exists() else
            cache.CacheFile(meta=cache.CacheMeta(signature=SIG, samu_tune="0.0.1", torch="1",
                                                 triton="1")))
    data.entries[key] = entry
    path.write_text(data.model_dump_json())
    cache.invalidate()
    return entry


def _scan(problem=PROBLEM, seed=0, **kw):
    inp = random_inputs(problem, seed=seed)
    args = (inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    return samu_tune.scan(*args, initial_state=inp.initial_state, segment_pos=inp.segment_pos,
                          output_final_state=problem.final_state, **kw), args


@pytest.fixture
def fakes(env):
    calls = []
    env.add(fake("fake_a", priority=10, calls=calls), fake("fake_b", calls=calls),
            fake("fake_c", calls=calls),
            fake("grid", grid_cost, config_model=GridConfig, calls=calls,
                 valid=lambda p, cfg: cfg.a < p.M))
    return calls


def _ran(calls):
    names = [c[0] for c in calls]
    calls.clear()
    return names


def test_rule_choice_is_the_highest_priority_eligible(fakes):
    out, args = _scan()
    assert _ran(fakes) == ["fake_a"]
    want = scan_reference(*args)
    torch.testing.assert_close(out.real, want.real)
    assert dispatch.choose(PROBLEM).source == "rule"
    registry.unregister("fake_a")  # the registry changed: the memo must not serve fake_a
    _scan()
    assert _ran(fakes) == ["fake_b"]  # priority 0, first by name among the rest
    choice = samu_tune.rule_choice(PROBLEM)
    assert choice.strategy.name == "fake_b"


def test_read_once_rule_names_the_staged_scan_first():
    """From B L M = 2^24 the rule names the first eligible read-once strategy, staged
    backward first; below it, none (priority order decides)."""
    from types import SimpleNamespace
    from samu_tune import rules

    def named(*names):
        return [SimpleNamespace(name=n) for n in names]

    large = ScanProblem(B=4, L=16384, M=256, dtype="bfloat16", device="cuda", backward=True)
    small = large.model_copy(update={"L": 16383})
    both = named("lookback", "lookback_once", "lookback_staged")
    assert rules._read_once(large, both)[0] == "lookback_staged"
    assert rules._read_once(large.model_copy(update={"backward": False}), both)[0] \
        == "lookback_staged"
    assert rules._read_once(large, named("lookback", "lookback_once"))[0] == "lookback_once"
    assert rules._read_once(small, both) is None


def test_exact_hit_and_cache_change_drop_the_memo(fakes):
    _scan()
    assert _ran(fakes) == ["fake_a"]
    _put(PROBLEM.key(), "fake_b")  # written in-process: the index and the memo see it now
    _scan()
    assert _ran(fakes) == ["fake_b"]
    d = dispatch.choose(PROBLEM)
    assert (d.source, d.source_key) == ("exact", PROBLEM.key())


def test_nearest_key_in_log_space_with_same_features(fakes):
    _put("B8-L16-M1-f32-forward", "fake_b")           # B*M = 8, L = 16: distance 0
    _put("B2-L64-M4-f32-forward", "fake_c")           # L 4x away
    _put("B2-L16-M4-f32-train", "grid", {"a": 1, "b": 1})  # same shape, other mode
    d = dispatch.choose(PROBLEM)
    assert (d.strategy.name, d.source, d.source_key) == ("fake_b", "nearest",
                                                         "B8-L16-M1-f32-forward")
    near = cache.nearest(ScanProblem(B=2, L=48, M=4, dtype="float32", device="cpu",
                                     backward=False), SIG)
    assert [e.key for _, e in near] == ["B2-L64-M4-f32-forward", "B8-L16-M1-f32-forward"]
    _scan()
    assert _ran(fakes) == ["fake_b"]


def test_nearest_keys_keep_m_alignment_apart(fakes):
    """A config tuned where M is a multiple of 8 is never the nearest choice where it is not
    (nor the reverse): the feature key tells them apart."""
    odd = PROBLEM.model_copy(update={"M": 6})
    aligned = PROBLEM.model_copy(update={"M": 16})
    assert (aligned.feature_key(), odd.feature_key()) == ("f32-forward",
                                                          "f32-forward-unaligned")
    _put("B2-L16-M8-f32-forward", "fake_b")              # nearest in log space, aligned
    trail = []
    d = dispatch.choose(odd, trail=trail)
    assert d.source == "rule"
    assert any("no entry with features f32-forward-unaligned" in t for t in trail)
    _put("B1-L64-M5-f32-forward", "fake_c")              # farther, but unaligned too
    d = dispatch.choose(odd)
    assert (d.strategy.name, d.source, d.source_key) == ("fake_c", "nearest",
                                                         "B1-L64-M5-f32-forward")
    assert dispatch.choose(aligned).source_key == "B2-L16-M8-f32-forward"


def test_nearest_keys_keep_narrow_and_long_problems_apart(fakes):
    """Few rows of modes over a long sequence (ScanProblem.narrow), more rows over one as
    long (ScanProblem.long) and the others are served from their own kind: the nearest
    entry across a boundary is passed over, and with none of its kind the rule serves."""
    narrow = ScanProblem(B=1, L=20000, M=256, dtype="float32", device="cpu", backward=False)
    long = narrow.model_copy(update={"B": 4})
    short = long.model_copy(update={"L": 16320})
    assert narrow.narrow() and not narrow.long()
    assert long.long() and not long.narrow() and not short.long() and not short.narrow()
    assert ([p.feature_key() for p in (narrow, long, short)]
            == ["f32-forward-narrow", "f32-forward-long", "f32-forward"])
    edge = ScanProblem(B=2, L=16320, M=256, dtype="float32", device="cpu")
    assert not edge.narrow() and edge.model_copy(update={"L": 16321}).narrow()
    assert not edge.model_copy(update={"L": 16321, "M": 264}).narrow()     # B M > 512
    assert edge.model_copy(update={"L": 16321, "M": 264}).long()
    assert not edge.model_copy(update={"L": 16321, "M": 95}).narrow()      # M < 96
    assert not edge.model_copy(update={"L": 16321, "M": 95}).long()
    assert edge.model_copy(update={"L": 16321, "M": 96}).narrow()
    _put("B1-L16384-M256-f32-forward", "fake_b")     # narrow: the nearest to all three
    _put("B4-L2048-M512-f32-forward", "fake_c")      # farther, neither
    assert dispatch.choose(narrow).source_key == "B1-L16384-M256-f32-forward"
    assert dispatch.choose(short).source_key == "B4-L2048-M512-f32-forward"
    assert dispatch.choose(long).source == "rule"
    _put("B16-L65536-M1024-f32-forward", "fake_a")   # long, the farthest
    assert dispatch.choose(long).source_key == "B16-L65536-M1024-f32-forward"


def test_nearest_config_is_fitted_to_the_problem_exact_is_not(env):
    """A strategy's ``fit`` adapts a nearest entry's config to the problem (the detail says
    what changed); an exact entry runs as tuned; a fitted config that is not valid for the
    problem is dropped for the entry's own."""
    import dataclasses
    calls = []
    refuse = []
    grid = dataclasses.replace(
        fake("grid", grid_cost, config_model=GridConfig, calls=calls,
             valid=lambda p, cfg: cfg.a < p.M and cfg.b not in refuse),
        fit=lambda p, cfg: cfg.model_copy(update={"b": 1}))
    env.add(grid)
    _put("B8-L16-M1-f32-forward", "grid", {"a": 2, "b": 0})      # nearest to PROBLEM
    d = dispatch.choose(PROBLEM)
    assert (d.source, d.config) == ("nearest", GridConfig(a=2, b=1))
    assert "fitted to this problem: b 0 -> 1" in d.detail
    _scan()
    assert calls[-1] == ("grid", GridConfig(a=2, b=1))
    refuse.append(1)
    dispatch.clear_memo()
    d = dispatch.choose(PROBLEM)
    assert d.config == GridConfig(a=2, b=0) and "fitted" not in d.detail
    refuse.clear()
    _put(PROBLEM.key(), "grid", {"a": 3, "b": 2})
    d = dispatch.choose(PROBLEM)
    assert (d.source, d.config) == ("exact", GridConfig(a=3, b=2))


def test_tuner_priors_cross_the_boundaries_that_serving_keeps(fakes):
    """A winner of a narrow problem is served only to narrow problems, but the tuner times it
    first for a problem of another kind too (ScanProblem.prior_features)."""
    from samu_tune.device import device_info
    long = ScanProblem(B=4, L=20000, M=256, dtype="float32", device="cpu", backward=False)
    assert long.prior_features() == ("f32-forward-long", "f32-forward", "f32-forward-narrow")
    short = long.model_copy(update={"L": 1000, "M": 300})
    assert short.prior_features() == ("f32-forward-unaligned", "f32-forward-unaligned-narrow",
                                      "f32-forward-unaligned-long")
    _put("B1-L16384-M256-f32-forward", "grid", {"a": 1, "b": 2})      # narrow
    _put("B4-L1024-M256-f32-forward", "grid", {"a": 3, "b": 0})       # plain, farther
    assert cache.nearest(long, SIG) == []
    grid = registry.get("grid")
    priors = tuner._priors(long, device_info("cpu"), [grid], {"grid": grid.configs(long)}, 5)
    assert [cfg.model_dump() for _, cfg in priors] == [{"a": 1, "b": 2}, {"a": 3, "b": 0}]


def test_tuner_priors_time_a_neighbours_fitted_config_first(env):
    """The tuner's first prior from a neighbour is its config as ``fit`` adapts it (what
    ``cached`` mode serves), then the stored one; the problem's own entry is not fitted."""
    import dataclasses
    from samu_tune.device import device_info
    grid = dataclasses.replace(fake("grid", grid_cost, config_model=GridConfig),
                               fit=lambda p, cfg: cfg.model_copy(update={"b": 1}))
    env.add(grid)
    _put("B8-L16-M1-f32-forward", "grid", {"a": 2, "b": 0})       # a neighbour
    space = {"grid": grid.configs(PROBLEM)}
    priors = tuner._priors(PROBLEM, device_info("cpu"), [grid], space, 5)
    assert [cfg.model_dump() for _, cfg in priors] == [{"a": 2, "b": 1}, {"a": 2, "b": 0}]
    _put(PROBLEM.key(), "grid", {"a": 3, "b": 2})                 # its own entry
    priors = tuner._priors(PROBLEM, device_info("cpu"), [grid], space, 5)
    assert [cfg.model_dump() for _, cfg in priors][0] == {"a": 3, "b": 2}
    assert {"a": 3, "b": 1} not in [cfg.model_dump() for _, cfg in priors]


def test_a_cached_config_invalid_here_falls_through(fakes):
    small_m = ScanProblem(B=2, L=16, M=2, dtype="float32", device="cpu", backward=False)
    _put(small_m.key(), "grid", {"a": 3, "b": 0})     # a=3 is not valid for M=2
    _put("B2-L32-M2-f32-forward", "grid", {"a": 1, "b": 2})
    trail = []
    d = dispatch.choose(small_m, trail=trail)
    assert (d.source, d.source_key, d.config) == ("nearest", "B2-L32-M2-f32-forward",
                                                  GridConfig(a=1, b=2))
    assert any("not valid for this problem" in t for t in trail)


def test_shipped_default_table_then_rule(fakes):
    _put("B4-L16-M4-f32-forward", "fake_c", shipped=True)   # other versions: fine when shipped
    d = dispatch.choose(PROBLEM)
    assert (d.strategy.name, d.source, d.source_key) == ("fake_c", "default",
                                                         "B4-L16-M4-f32-forward")
    _put(PROBLEM.key(), "fake_b", shipped=True)
    assert dispatch.choose(PROBLEM).strategy.name == "fake_b"
    other = PROBLEM.model_copy(update={"dtype": "bfloat16"})
    assert dispatch.choose(other).source == "rule"
    assert "older" not in dispatch.choose(PROBLEM).detail
    # a shipped entry measured with an older strategy source is served, and says so
    _put(PROBLEM.key(), "fake_b", shipped=True, source_hash="0123abcd")
    d = dispatch.choose(PROBLEM)
    assert d.strategy.name == "fake_b" and "older fake_b source (0123abcd" in d.detail


def test_initial_and_final_state_use_the_plain_problems_entry(fakes):
    stateful = PROBLEM.model_copy(update={"initial_state": True, "final_state": True})
    assert dispatch.choose(stateful).source == "rule"
    _put("B4-L16-M4-f32-forward", "fake_c", shipped=True)
    d = dispatch.choose(stateful)
    assert (d.strategy.name, d.source, d.source_key) == ("fake_c", "default",
                                                         "B4-L16-M4-f32-forward")
    assert "without initial/final state" in d.detail
    _put(PROBLEM.key(), "fake_b")                      # the user cache's exact plain entry
    d = dispatch.choose(stateful)
    assert (d.strategy.name, d.source, d.source_key) == ("fake_b", "exact", PROBLEM.key())
    _put(stateful.key(), "fake_a")                     # an entry with the features wins
    assert dispatch.choose(stateful).strategy.name == "fake_a"
    # resets are never relaxed
    resets = PROBLEM.model_copy(update={"resets": True, "final_state": True})
    assert dispatch.choose(resets).source == "rule"


def test_off_policy_is_rules_only(fakes, env):
    _put(PROBLEM.key(), "fake_b")
    env.set_env(SAMU_TUNE_MODE="off")
    _scan()
    assert _ran(fakes) == ["fake_a"]
    assert dispatch.choose(PROBLEM).source == "rule"
    assert dispatch.choose(PROBLEM, policy="cached").source == "exact"


def test_online_tunes_on_miss_and_writes_the_cache(env, clock, monkeypatch):
    calls = []
    env.add(fake("slow", 3.0, priority=10, calls=calls), fake("quick", 1.0, calls=calls))
    registry.unregister("reference")  # free under the fake clock
    env.set_env(SAMU_TUNE_MODE="online", SAMU_TUNE_TUNE_BUDGET_S="30")
    tunes = []
    real_tune = tuner.tune
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: tunes.append(a) or real_tune(*a, **k))
    _scan()
    assert len(tunes) == 1
    calls.clear()
    _scan(seed=1)
    _scan(seed=2)
    assert len(tunes) == 1 and _ran(calls) == ["quick", "quick"]
    entry = cache.lookup(PROBLEM, SIG)
    assert entry.strategy == "quick" and entry.runner_up.strategy == "slow"
    data = json.loads(cache.path(SIG).read_text())
    assert PROBLEM.key() in data["entries"]
    # a new process: an exact hit, no tuning
    cache.invalidate()
    dispatch.clear_memo()
    assert dispatch.choose(PROBLEM).source == "exact" and len(tunes) == 1


def test_no_tuning_while_capturing_a_cuda_graph(fakes, env, monkeypatch):
    env.set_env(SAMU_TUNE_MODE="online")

    def no_tuning(*a, **k):
        raise AssertionError("tuned during CUDA graph capture")
    monkeypatch.setattr(tuner, "tune", no_tuning)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    _scan()
    assert _ran(fakes) == ["fake_a"]
    assert dispatch._MEMO == {}  # not memoized: the first call after capture tunes
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("tuning now")))
    _scan()  # tuning raised: reported in the trail, falls back, still runs
    assert _ran(fakes) == ["fake_a"]


def test_forced_strategy_and_bad_config(fakes):
    _put(PROBLEM.key(), "fake_b")
    _scan(strategy="fake_c")
    assert _ran(fakes) == ["fake_c"]
    _scan(strategy=("grid", {"a": 2, "b": 1}))
    _scan(strategy=("grid", GridConfig(a=1)))
    _scan(strategy=("grid", None))  # the default config
    assert fakes == [("grid", GridConfig(a=2, b=1)), ("grid", GridConfig(a=1)),
                     ("grid", GridConfig())]
    fakes.clear()
    with pytest.raises(ValueError, match="bad config .* for strategy 'grid'"):
        _scan(strategy=("grid", {"a": 9}))
    with pytest.raises(ValueError, match="unknown config fields"):
        _scan(strategy=("grid", {"c": 1}))
    with pytest.raises(TypeError, match="strategy must be"):
        _scan(strategy=("grid",))
    assert fakes == []


def test_forced_config_invalid_for_this_problem(fakes):
    problem = ScanProblem(B=1, L=4, M=2, dtype="float32", device="cpu", backward=False)
    with pytest.raises(ValueError, match="not valid for B1-L4-M2"):
        _scan(problem, strategy=("grid", {"a": 3}))
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        _scan(strategy="nope")
    registry.register(fake("fwd_only", backward=False))
    with pytest.raises(samu_tune.NoEligibleStrategy, match="no backward"):
        inp = random_inputs(PROBLEM, seed=0)
        samu_tune.scan(inp.eta, inp.delta, inp.nu_log, inp.theta_log,
                       inp.br.requires_grad_(True), inp.bi, strategy="fwd_only")


def test_explain_lists_every_strategy_and_the_choice(fakes):
    registry.register(fake("atomic", deterministic=False))
    registry.register(fake("fwd_only", backward=False))
    train = PROBLEM.model_copy(update={"backward": True, "deterministic": True})
    ex = samu_tune.explain(train)
    assert (ex.strategy, ex.source, ex.config) == ("fake_a", "rule", {})
    reports = {r.name: r for r in ex.strategies}
    assert not reports["atomic"].eligible and "deterministic" in reports["atomic"].reasons[0]
    assert reports["fwd_only"].reasons == ["no backward"]
    assert reports["grid"].eligible and reports["grid"].configs == 12
    assert reports["grid"].default_config == {"a": 0, "b": 0}
    text = str(ex)
    assert "choice: fake_a" in text and "from rule" in text
    assert "atomic (priority 0, 0 configs): ineligible: not deterministic" in text
    assert "cache: no exact entry for B2-L16-M4-f32-train-det" in text
    # explain with the arguments of scan, after caching: exact / nearest with the source key
    _put(PROBLEM.key(), "fake_b")
    inp = random_inputs(PROBLEM, seed=0)
    ex = samu_tune.explain(inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    assert (ex.strategy, ex.source, ex.source_key) == ("fake_b", "exact", PROBLEM.key())
    bigger = PROBLEM.model_copy(update={"L": 64})
    ex = samu_tune.explain(bigger)
    assert (ex.source, ex.source_key) == ("nearest", PROBLEM.key())
    assert f"[{PROBLEM.key()}]" in str(ex)
    ex = samu_tune.explain(PROBLEM, strategy=("grid", {"a": 9}))
    assert ex.strategy is None and "bad config" in ex.error


def test_explain_under_online_never_tunes(fakes, env, monkeypatch):
    env.set_env(SAMU_TUNE_MODE="online")
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: pytest.fail("explain tuned"))
    ex = samu_tune.explain(PROBLEM)
    assert ex.source == "rule" and any("would tune" in t for t in ex.trail)


def test_distributed_ranks_run_rank0_choice(tmp_path):
    worker = Path(__file__).with_name("_dist_worker.py")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    init = tmp_path / "init"
    procs = [subprocess.Popen([sys.executable, str(worker), str(rank), "2", str(init),
                               str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for rank in (0, 1)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-3000:]
    results = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["local"] == "fake_b" and results[1]["local"] == "fake_a"
    for r in results:
        assert r["calls"] == ["fake_b"] * 3


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_scan_inside_torch_compile(fakes, backend):
    problem = ScanProblem(B=2, L=7, M=3, dtype="float32", device="cpu", backward=True,
                          initial_state=True, final_state=True)
    inp = random_inputs(problem, seed=3)

    def f(eta, br, bi, h0r):
        x = br * 2.0
        out = samu_tune.scan(eta, inp.delta, inp.nu_log, inp.theta_log, x, bi,
                             initial_state=(h0r, inp.initial_state[1]),
                             output_final_state=True)
        return (out.real.square().sum() + out.imag.sum() + out.final_state[0].sum()) * 0.5

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend)
    leaves = [t.detach().clone().requires_grad_(True)
              for t in (inp.eta, inp.br, inp.bi, inp.initial_state[0])]
    want_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    got = compiled(*leaves)
    got.backward()
    want = f(*want_leaves)
    want.backward()
    torch.testing.assert_close(got, want)
    for a, b in zip(leaves, want_leaves):
        torch.testing.assert_close(a.grad, b.grad)
    assert "fake_a" in _ran(fakes)


def test_cache_hit_overhead_is_small(env):
    trivial = fake("trivial", trivial=True, priority=100)
    env.add(trivial)
    problem = ScanProblem(B=1, L=8, M=4, dtype="float32", device="cpu", backward=False)
    inp = random_inputs(problem, seed=0)
    args = (inp.eta, inp.delta, inp.nu_log, inp.theta_log, inp.br, inp.bi)
    cfg = trivial.default_config(problem)
    samu_tune.scan(*args)  # decide once
    assert dispatch.choose(problem).strategy is trivial

    def per_call(fn, n=300):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
        return best
    direct = per_call(lambda: trivial.run(inp, cfg))
    via_scan = per_call(lambda: samu_tune.scan(*args))
    overhead_us = (via_scan - direct) * 1e6
    print(f"dispatch overhead {overhead_us:.1f} us per call")
    assert overhead_us < 200
