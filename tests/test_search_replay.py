"""benchmarks/search_replay.py: today's search priced by recorded exhaustive GPU timings."""
import copy
import json
from pathlib import Path

import pytest

from benchmarks import search_replay
from samu_tune.settings import reload_settings

RUNS = Path(__file__).parents[1] / "benchmarks/results"


@pytest.fixture(autouse=True)
def _settings_back(monkeypatch):
    monkeypatch.delenv("SAMU_TUNE_CACHE_DIR", raising=False)
    yield
    reload_settings()


def _case(path: Path, key: str) -> dict:
    data = json.loads(path.read_text())
    return data, next(c for c in data["cases"] if c["key"] == key)


def test_the_search_on_recorded_timings_and_a_best_it_never_times(tmp_path):
    """(3, 5000, 300) forward on the H200 (s26): the search picks the exhaustive best after
    about a dozen candidates; with a config it never evaluates made the fastest, the
    replay reports the miss (the replay can fail)."""
    path = RUNS / "NVIDIA-H200/s26/tuner/bench_tuner.json"
    data, case = _case(path, "B3-L5000-M300-bf16-forward")
    f = tmp_path / "NVIDIA-H200/s26/tuner/bench_tuner.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({**data, "cases": [case]}))
    (row,) = search_replay.replay([f], patience=6)
    assert row["ratio"] == 1.0 and row["untimed"] == [] and row["stopped"] == "converged"
    assert 5 <= row["evaluated"] <= 30
    faster = copy.deepcopy(case)
    unseen = next(r for r in faster["exhaustive"]["rows"] if r["name"] not in row["names"])
    unseen["ms"] = 1e-3
    f.write_text(json.dumps({**data, "cases": [faster]}))
    (miss,) = search_replay.replay([f], patience=6)
    assert miss["ratio"] > 10


def test_train_starts_from_its_shapes_forward_pick(tmp_path):
    """A train case's priors hold the same shape's replayed forward pick."""
    path = RUNS / "NVIDIA-H200/s26/tuner/bench_tuner.json"
    data, fwd = _case(path, "B2-L32768-M128-bf16-forward")
    _, train = _case(path, "B2-L32768-M128-bf16-train")
    f = tmp_path / "NVIDIA-H200/s26/tuner/bench_tuner.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({**data, "cases": [train, fwd]}))
    rows = search_replay.replay([f], patience=6)
    assert [r["key"] for r in rows] == ["B2-L32768-M128-bf16-forward",
                                        "B2-L32768-M128-bf16-train"]
    assert all(r["ratio"] is not None and r["ratio"] <= 1.02 for r in rows)
