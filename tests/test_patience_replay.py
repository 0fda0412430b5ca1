"""benchmarks/patience_replay.py: the patience stop replayed on a recorded search."""
from benchmarks.patience_replay import replay, study


def _cand(name, phase, ms, status="ok"):
    return {"name": name, "phase": phase, "status": status, "time_ms": ms}


def test_replay_stops_after_stale_refinements_and_prices_the_picks():
    # a prior, a screen, then refinements: six within 1% of the best (one failed) and only
    # then a much better one, which a search with patience 6 never reaches
    cands = [_cand("prior", "prior", 1.00), _cand("screen", "screen", 1.20)]
    cands += [_cand(f"r{i}", "refine", 0.995) for i in range(5)]
    cands += [_cand("bad", "refine", None, status="failed"), _cand("late", "refine", 0.80)]
    pick, n = replay(cands, patience=6, min_gain=0.01)
    assert (pick, n) == ("r0", 8)
    # a gain of more than 1% resets the count: the late candidate is reached
    cands[3] = _cand("r1", "refine", 0.95)
    assert replay(cands, patience=6, min_gain=0.01) == ("late", 9)
    recorded = ([_cand("prior", "prior", 1.0), _cand("good", "refine", 0.95)]
                + [_cand(f"r{i}", "refine", 0.95) for i in range(6)]
                + [_cand("late", "refine", 0.8)])
    case = {"key": "B1-L8-M8-f32-train",
            "tune": {"candidates": recorded, "pick": "late", "stopped": "budget_s"},
            "exhaustive": {"rows": [{"name": "late", "ms": 0.8}, {"name": "good", "ms": 0.96},
                                    {"name": "x", "error": "not timed"}]}}
    (row,) = study([case], patience=6, min_gain=0.01)
    assert (row["pick"], row["evaluated"]) == ("good", 8) and abs(row["ratio"] - 1.2) < 1e-9
    assert row["whole_ratio"] == 1.0 and not row["same"]
    # priors and screens never count towards the stop
    only_screens = [_cand(f"s{i}", "screen", 1.0) for i in range(10)]
    assert replay(only_screens, patience=2, min_gain=0.01) == ("s0", 10)
