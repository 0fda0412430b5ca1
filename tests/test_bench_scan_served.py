"""benchmarks/bench_scan.py's served phase on the CPU: timings and explain stubbed."""
import os
import types

import pytest

import samu_tune
from benchmarks import bench_scan
from samu_tune.settings import reload_settings, settings


@pytest.fixture(autouse=True)
def _settings_back():
    yield
    reload_settings()          # after monkeypatch restored the environment (fixture order)


def test_served_rows_time_cached_mode_on_an_empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SAMU_TUNE_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.delenv("SAMU_TUNE_MODE", raising=False)
    seen = []

    def fake_measure(kind, name, config, shape, dtype, modes, reps_ms, do_bench):
        # what dispatch reads while the served call is timed
        seen.append((settings().cache_dir, settings().mode, os.listdir(settings().cache_dir)))
        return {"forward_ms": 2.0, "train_ms": 5.0}

    monkeypatch.setattr(bench_scan, "measure", fake_measure)
    monkeypatch.setattr(samu_tune, "explain", lambda p: types.SimpleNamespace(
        strategy="lookback", config={"chunk": 64}, source="rule"))
    shape = (3, 5000, 300)
    rows = [{"kind": "strategy", "shape": list(shape), "dtype": "bfloat16",
             "forward_ms": 1.6, "train_ms": 5.0},
            {"kind": "strategy", "shape": list(shape), "dtype": "bfloat16", "forward_ms": 3.0},
            {"kind": "accel", "shape": list(shape), "dtype": "bfloat16",
             "forward_ms": 4.0, "train_ms": 7.5},
            {"kind": "strategy", "shape": [1, 8, 8], "dtype": "bfloat16", "forward_ms": 0.1}]
    args = types.SimpleNamespace(rep_ms=1, do_bench=False)
    (row,) = bench_scan.served_rows([(shape, "bfloat16")], rows, args)
    cache_dir, mode, listing = seen[0]
    assert mode == "cached" and listing == [] and str(cache_dir) != str(tmp_path / "user")
    assert abs(row["forward_vs_best"] - 1.25) < 1e-9 and row["train_vs_best"] == 1.0
    assert row["forward_accel_over"] == 2.0 and row["train_accel_over"] == 1.5
    assert row["forward_choice"] == "lookback {'chunk': 64} (rule)"
    # the environment and settings are the caller's again
    assert os.environ["SAMU_TUNE_CACHE_DIR"] == str(tmp_path / "user")
    assert "SAMU_TUNE_MODE" not in os.environ
    assert str(settings().cache_dir) == str(tmp_path / "user")


def test_a_served_failure_is_recorded(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(bench_scan, "measure", boom)
    (row,) = bench_scan.served_rows([((1, 64, 8), "bfloat16")], [],
                                    types.SimpleNamespace(rep_ms=1, do_bench=False))
    assert "no GPU here" in row["error"] and "forward_ms" not in row


def test_served_replay_prices_todays_choice_by_the_recorded_times(monkeypatch, tmp_path):
    """benchmarks/served_replay.py on the committed H100 off-grid run: what cached mode
    serves now with the shipped H100 table, priced by that run's timings, as on that GPU
    (the Gluon strategies eligible although this process may run the Triton interpreter).
    (4, 16384, 256) is long (256 chunks, not narrow): the rule serves it, the read-once scan
    with the staged backward; (2, 32768, 128) gets the read-once entry of (1, 16384, 256).
    (24, 700, 384) training is the one case past 10% (the nearest entry's 32-step chunks)."""
    import json
    from pathlib import Path
    from benchmarks import served_replay
    from samu_tune.settings import settings
    monkeypatch.setenv("SAMU_TUNE_CACHE_DIR", str(tmp_path / "user"))
    reload_settings()
    before = settings()
    path = (Path(__file__).parents[1] / "benchmarks/results/NVIDIA-H100/s46/offgrid_served"
            / "bench.json")
    rows = {(tuple(r["shape"]), r["mode"]): r
            for r in served_replay.replay(json.loads(path.read_text()))}
    assert settings() is before                          # the run's view is put back
    assert len(rows) == 20 and all(r["ratio"] is not None for r in rows.values())
    for mode in ("forward", "train"):
        long = rows[((4, 16384, 256), mode)]
        assert long["choice"] == "lookback_staged rule" and long["ratio"] < 1.01
        # the same forward kernel under either name: which one a table lists is timing noise
        name, _, rest = rows[((2, 32768, 128), mode)]["choice"].partition(" ")
        assert name in ("lookback_once", "lookback_staged")
        assert rest == f"default B1-L16384-M256-bf16-{mode}"
    over = {key for key, r in rows.items() if r["ratio"] >= 1.10}
    assert over == {((24, 700, 384), "train")}
    assert max(r["ratio"] for r in rows.values()) < 1.11
