"""The tuner's clocks: the CUDA sample's busy-wait on a simulated stream, the CPU path, and
cache entries written before ``host_ms`` existed.

The simulated stream (:class:`SimGpu`) runs on the fake CPU clock: every launch costs the host
``LAUNCH_MS`` and starts on the GPU at the later of the GPU being free and its enqueue (plus a
latency); events take the GPU time at their place in the stream -- the one property that made
the old "flush, record, call, record" sample read the host's time.
"""
import json
import time

import pytest
import torch

import samu_tune
from samu_tune import cache, timing
from samu_tune.ops.scan import timing as scan_timing
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.results import Candidate

from _fakes import clock, env, fake  # noqa: F401  (fixtures)

LAUNCH_MS = 0.005
LATENCY_MS = 0.004
FLUSH_MS = 0.03
RATE = 1.98e6          # cycles per ms of the simulated SM clock


class SimEvent:
    t = None

    def elapsed_time(self, end: "SimEvent") -> float:
        return end.t - self.t


class SimGpu(timing.Gpu):
    """One CUDA stream in GPU milliseconds, driven by the fake host clock (seconds)."""

    def __init__(self, clk, rate=RATE):
        super().__init__(torch.device("cpu"))
        self.clock, self.rate, self.gpu_t = clk, rate, 0.0

    def host(self) -> float:
        return self.clock() * 1e3

    def run(self, ms: float) -> None:
        """Enqueue a kernel of ``ms`` GPU time."""
        self.clock.advance(LAUNCH_MS)
        self.gpu_t = max(self.gpu_t, self.host() + LATENCY_MS) + ms

    def sleep(self, cycles):
        self.run(cycles / self.rate)

    def flush(self):
        self.run(FLUSH_MS)

    def event(self):
        return SimEvent()

    def record(self, event):
        self.run(0.0)
        event.t = self.gpu_t

    def sync(self):
        self.clock.advance(max(0.0, self.gpu_t - self.host()))


def _call(gpu, clk, host_ms, gpu_ms):
    """A launch-bound call: ``host_ms`` of Python before its kernel of ``gpu_ms``."""
    def call():
        clk.advance(host_ms[0] if isinstance(host_ms, list) else host_ms)
        gpu.run(gpu_ms)
    return call


def test_calibration_finds_the_sleep_rate(clock):
    gpu = SimGpu(clock)
    assert timing.calibrate(gpu) == pytest.approx(RATE)
    assert gpu.cycles_per_ms == pytest.approx(RATE)


def test_sleep_length_covers_recent_host_times_and_is_capped():
    assert timing.sleep_ms_for([]) == pytest.approx(timing.SLEEP_MARGIN_MS)
    host = [0.1] * 20 + [0.4] + [0.2] * (timing.HOST_WINDOW - 1)
    want = timing.SLEEP_FACTOR * 0.4 + timing.SLEEP_MARGIN_MS
    assert timing.sleep_ms_for(host) == pytest.approx(want)
    # the 0.4 ms falls out of the window
    assert timing.sleep_ms_for(host + [0.2]) == pytest.approx(
        timing.SLEEP_FACTOR * 0.2 + timing.SLEEP_MARGIN_MS)
    assert timing.sleep_ms_for([1e3]) == timing.SLEEP_CAP_MS


def test_launch_bound_call_reads_its_gpu_time_and_host_time(clock):
    gpu = SimGpu(clock)
    host: list[float] = []
    samples = timing.gpu_samples(_call(gpu, clock, 0.5, 0.08), 6, gpu, host)
    assert samples == pytest.approx([0.08] * 6)
    # the host time of each call: its Python and one launch; 2 untimed first calls + 6 samples
    assert len(host) == 1 + 6 and timing.median(host) == pytest.approx(0.5 + LAUNCH_MS)
    assert gpu.late == 0


def test_without_the_busy_wait_the_sample_reads_the_host(clock, monkeypatch):
    # the simulated stream reproduces the old clock's error, so the test above can fail
    monkeypatch.setattr(timing, "SLEEP_FACTOR", 0.0)
    monkeypatch.setattr(timing, "SLEEP_MARGIN_MS", 0.0)
    gpu = SimGpu(clock)
    samples = timing.gpu_samples(_call(gpu, clock, 0.5, 0.08), 3, gpu, [])
    assert min(samples) > 0.5


def test_gpu_bound_call_is_timed_exactly(clock):
    gpu = SimGpu(clock)
    samples = timing.gpu_samples(_call(gpu, clock, 0.05, 2.0), 3, gpu, [])
    assert samples == pytest.approx([2.0] * 3)


def test_a_late_sample_is_taken_again_with_a_longer_wait(clock):
    gpu = SimGpu(clock)
    host_ms = [0.1]
    call = _call(gpu, clock, host_ms, 0.08)
    host: list[float] = []
    timing.gpu_samples(call, 2, gpu, host)
    host_ms[0] = 1.0                      # the host got slower than the wait (0.2 ms)
    samples = timing.gpu_samples(call, 3, gpu, host)
    assert samples == pytest.approx([0.08] * 3)
    assert gpu.late == 0
    assert len(host) == 1 + 2 + 3 + 1     # one retaken sample


def test_a_host_slower_than_the_cap_is_counted_late(clock):
    gpu = SimGpu(clock)
    slow = timing.SLEEP_CAP_MS + 5.0
    samples = timing.gpu_samples(_call(gpu, clock, slow, 0.08), 2, gpu, [])
    assert gpu.late == 2
    assert min(samples) > 0.08            # the GPU waited for the host inside the window


def test_cpu_path_is_wall_time_of_the_call(env, clock):
    problem = ScanProblem(B=2, L=6, M=4, dtype="float32", device="cpu", backward=False)
    strat = fake("cost3", 3.0)
    step = scan_timing.Step(problem, "cpu")

    def fn(inputs):
        return strat.run(inputs, None)
    assert timing.sample(step, fn, 4) == pytest.approx([3.0] * 4)
    assert timing.host_ms(step, fn) is None


def test_cpu_tune_has_no_host_time_and_old_candidates_load(env, clock):
    env.add(fake("fast", 1.0), fake("slow", 2.0))
    problem = ScanProblem(B=2, L=6, M=4, dtype="float32", device="cpu", backward=False)
    result = samu_tune.tune(problem, strategies=["fast", "slow"], reps=2)
    assert result.winner.host_ms is None
    assert "host" not in result.summary()
    old = result.winner.model_dump(mode="json")
    del old["host_ms"]
    assert Candidate.model_validate(old).host_ms is None


def test_entries_written_before_host_ms_still_load(env):
    sig = "cpu-interpreter"
    v = cache.versions()
    old_entry = dict(key="B2-L6-M4-f32-forward", mode="forward", strategy="reference",
                     config={}, time_ms=1.5, source_hash=samu_tune.get("reference").source_hash,
                     measured_at="2026-01-01", cpu_wall_time=True, versions=dict(v),
                     search="refine")
    meta = dict(format=cache.FORMAT, signature=sig, samu_tune=v["samu_tune"], torch=v["torch"],
                triton=v["triton"])
    p = env.cache_dir / f"{sig}.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"meta": meta, "entries": {old_entry["key"]: old_entry}}))
    cache.invalidate()
    got = cache.lookup(ScanProblem.from_key(old_entry["key"], device="cpu"), sig)
    assert got is not None and got.time_ms == 1.5 and got.host_ms is None
    # a new entry with host_ms round-trips beside it
    new = got.model_copy(update={"key": "B2-L7-M4-f32-forward", "host_ms": 0.25})
    cache.put(new, sig)
    cache.invalidate()
    assert cache.lookup(ScanProblem.from_key(new.key, device="cpu"), sig).host_ms == 0.25
    assert cache.lookup(ScanProblem.from_key(old_entry["key"], device="cpu"), sig) == got


def test_bench_tuner_sets():
    """benchmarks/bench_tuner.py's exhaustive set is the decoupled, sub=1, window=1 lookback
    subspace plus the other strategies' defaults; its neighbours differ from a default in one
    field."""
    from benchmarks import bench_tuner
    from samu_tune import registry
    (problem,) = bench_tuner.parse_cases("2,300,70:train", "float32", "cpu")
    assert problem.backward and (problem.B, problem.L, problem.M) == (2, 300, 70)
    ex = bench_tuner.exhaustive_set(problem)
    eligible = {s.name for s, r in registry.eligible(problem) if not r} - {"reference"}
    assert {n for n, _ in ex} == eligible
    look = registry.get("lookback")
    sub = [c for c in look.configs(problem)
           if c.lookback == "decoupled" and c.sub == 1 and c.window == 1]
    assert len(sub) > 1
    got = [cfg for n, cfg in ex if n == "lookback"]
    assert all(look.parse_config(c) in sub or look.parse_config(c) == look.default_config(problem)
               for c in got)
    assert len(got) >= len(sub)
    # no tuned problem in the (CPU) tables: no priors, the defaults and their neighbours only
    for name, cfg in bench_tuner.neighbour_set(problem):
        strat = registry.get(name)
        default = strat.default_config(problem).model_dump()
        assert sum(cfg[k] != default[k] for k in cfg) <= 1


def test_bench_tuner_pool_passes_and_partial_mark(monkeypatch):
    """The compile pool's first pass leaves what it did not reach (in order) for a second
    pass; counts add up across the passes; a ratio against a partly timed exhaustive set is
    marked partial in the table."""
    import concurrent.futures as cf
    import threading
    from benchmarks import bench_tuner
    gate = threading.Event()

    def fake_warm(task):
        if task[0] == "slow":
            gate.wait(5)
        return task, 0.5, "boom" if task[0] == "bad" else None

    monkeypatch.setattr(bench_tuner, "_warm", fake_warm)
    tasks = [("slow", {}, "k", "cpu"), ("bad", {}, "k", "cpu")] + [
        ("t%d" % i, {}, "k", "cpu") for i in range(6)]
    with cf.ThreadPoolExecutor(1) as pool:
        timer = threading.Timer(1.5, gate.set)
        timer.start()
        first = bench_tuner.warm_in(pool, tasks, time.monotonic() + 0.2)
        timer.join()
        assert first["done"] == 1 and first["cancelled"] == 7 and first["left"] == tasks[1:]
        second = bench_tuner.warm_in(pool, first["left"][:3], time.monotonic() + 30)
    assert second["done"] == 3 and second["cancelled"] == 0 and second["left"] == []
    assert len(second["errors"]) == 1 and "boom" in second["errors"][0]
    merged = bench_tuner._merge_warm(first, second)
    assert (merged["tasks"], merged["done"], merged["cancelled"]) == (8, 4, 4)
    assert bench_tuner.warm_in(None, tasks, 0.0)["left"] == tasks

    rows = [{"name": "a", "ms": 1.0}, {"name": "b", "error": "not timed: --time-limit"}]
    case = {"key": "B1-L8-M8-f32-forward", "tune": {}, "ratio": 1.0,
            "retime": {"exhaustive#1": {"name": "a", "ms": 1.0}},
            "exhaustive": {"rows": rows, "timed": 1}}
    table = bench_tuner.markdown({"cases": [case], "warm": {}})
    assert "| 1/2 |" in table and "1.000 (partial)" in table
    case["exhaustive"] = {"rows": rows[:1], "timed": 1}
    assert "(partial)" not in bench_tuner.markdown({"cases": [case], "warm": {}})


def test_bench_tuner_tunes_with_the_patience_stop(monkeypatch):
    """bench_tuner's tune is the search online mode and profile run: the settings' patience
    by default (0: none), the stop reason in its table."""
    from benchmarks import bench_tuner
    seen = {}

    class Result:
        candidates, stopped, winner, margin = [], "converged", None, None

        def failed(self):
            return []

    def fake_tune(problem, mode, **kw):
        seen.update(kw)
        return Result()

    monkeypatch.setattr(bench_tuner.samu_tune, "tune", fake_tune)
    (problem,) = bench_tuner.parse_cases("2,300,70:forward", "float32", "cpu")
    info = bench_tuner.tune_case(problem, 7.0, 6)
    assert seen == {"budget_s": 7.0, "patience": 6}
    assert (info["patience"], info["stopped"]) == (6, "converged")
    table = bench_tuner.markdown({"cases": [{"key": problem.key(), "tune": {
        **info, "wall_s": 1.0}}], "warm": {}})
    assert "1.0 (7, converged)" in table


def test_bench_tuner_case_exhaustive_ends_with_its_share(monkeypatch):
    """A case's exhaustive timing ends with its share of the time left (deadline / cases
    left), so that a slow first case leaves the others their time."""
    import argparse
    from benchmarks import bench_tuner
    seen = {}
    monkeypatch.setattr(bench_tuner, "tune_case", lambda p, budget, patience: {})
    monkeypatch.setattr(bench_tuner, "exhaustive_set", lambda p: [("lookback", {})])
    monkeypatch.setattr(bench_tuner, "shipped_choice", lambda p: None)

    def fake_exhaustive(problem, cands, args, deadline, device):
        seen["deadline"] = deadline
        return [{"name": "a", "ms": 1.0, "strategy": "lookback", "config": {}}]

    monkeypatch.setattr(bench_tuner, "exhaustive_case", fake_exhaustive)
    args = argparse.Namespace(reserve_s=12.0, budget=25.0, patience=6, max_exhaustive=0,
                              retime_rounds=1)
    (problem,) = bench_tuner.parse_cases("2,300,70:forward", "float32", "cpu")
    start = time.monotonic()
    bench_tuner.run_case(problem, args, start + 400.0, "cpu", 4)
    assert start + 95.0 - 1.0 <= seen["deadline"] <= time.monotonic() + 95.0
    bench_tuner.run_case(problem, args, start + 400.0, "cpu", 1)
    assert seen["deadline"] == start + 395.0
