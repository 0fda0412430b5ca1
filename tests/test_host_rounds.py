"""benchmarks/host_rounds.py: two trees' bench_host rounds paired per round."""
import json

from benchmarks import host_rounds


def _write(root, rnd, scan_ms, layer_ms, decode_ms):
    d = root / f"r{rnd}"
    d.mkdir(parents=True)
    data = {"scan": [{"shape": [1, 64, 8], "mode": "train",
                      "samu_tune": {"host_ms": scan_ms}, "accelerated_scan": {"host_ms": 9.0}},
                     {"shape": [2, 32, 8], "mode": "forward", "samu_tune": {"error": "x"}}],
            "layer": [{"shape": [1, 64, 8], "mode": "forward", "host_ms": layer_ms}],
            "decode": [{"B": 4, "M": 8, "host_ms": decode_ms}]}
    (d / "bench_host.json").write_text(json.dumps(data))


def test_rounds_pair_within_a_round(tmp_path, capsys):
    head, base = tmp_path / "host", tmp_path / "host_base"
    # the host slows down round by round; this tree is 20% faster within each round
    for rnd, drift in ((1, 1.0), (2, 2.0), (3, 1.5)):
        _write(head, rnd, 0.8 * drift, 0.4 * drift, 0.05)
        _write(base, rnd, 1.0 * drift, 0.4 * drift, 0.10)
    (head / "r4").mkdir()                       # a round without a result is left out
    assert sorted(host_rounds.round_dirs(head)) == [1, 2, 3]
    out = tmp_path / "rounds.md"
    assert host_rounds.main([str(head), str(base), "--out", str(out)]) == 0
    rows = {(r["part"], r["mode"]): r for r in json.loads(out.with_suffix(".json").read_text())}
    assert set(rows) == {("scan", "train"), ("layer", "forward"), ("decode", "step")}
    scan = rows["scan", "train"]
    assert abs(scan["ratio"] - 0.8) < 1e-9 and len(scan["ratios"]) == 3
    assert abs(scan["head_ms"] - 1.2) < 1e-9 and abs(scan["base_ms"] - 1.5) < 1e-9
    assert abs(rows["decode", "step"]["ratio"] - 0.5) < 1e-9
    assert "| scan | (1, 64, 8) | train | 1.200 | 1.500 | 0.800 | 0.800-0.800 |" in out.read_text()
    assert "| scan | (1, 64, 8) | train |" in capsys.readouterr().out


def test_no_rounds_is_an_error(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    assert host_rounds.main([str(tmp_path / "a"), str(tmp_path / "a")]) == 1
    assert "no rounds" in capsys.readouterr().err


def test_a_round_missing_in_one_tree_does_not_shift_the_pairs(tmp_path):
    head, base = tmp_path / "host", tmp_path / "host_base"
    for rnd, drift in ((1, 1.0), (2, 2.0), (3, 3.0)):
        if rnd != 2:                            # this tree's round 2 failed before a row
            _write(head, rnd, 0.8 * drift, 0.4, 0.05)
        _write(base, rnd, 1.0 * drift, 0.4, 0.05)
    rows = host_rounds.paired(
        {n: host_rounds.host_times(d / "bench_host.json")
         for n, d in host_rounds.round_dirs(head).items()},
        {n: host_rounds.host_times(d / "bench_host.json")
         for n, d in host_rounds.round_dirs(base).items()})
    scan = next(r for r in rows if r["part"] == "scan")
    assert [round(x, 9) for x in scan["ratios"]] == [0.8, 0.8]
