"""The ``samu-tune`` command line through its real entry point, on the CPU (interpreter).

``samu_tune.cli.main([...])`` with captured output, and a subprocess for ``python -m``.
Profiles run real strategies on tiny shapes, or fakes with an exact clock (``_fakes``).
"""
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from samu_tune import cache, dispatch, registry, settings
from samu_tune.cli import main
from samu_tune.ops.scan.problem import ScanProblem

from _fakes import clock, env, fake  # noqa: F401  (fixtures)

SIG = "cpu-interpreter"


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    """Tests read cell contents: a wide console, whatever the runner's COLUMNS."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    """A private cache (real registry) and no shipped tables."""
    d = tmp_path / "cache"
    monkeypatch.setenv("SAMU_TUNE_CACHE_DIR", str(d))
    monkeypatch.setattr(cache, "DEFAULTS_DIR", tmp_path / "defaults")
    settings.reload_settings()
    cache.invalidate()
    dispatch.clear_memo()
    yield d
    monkeypatch.undo()
    settings.reload_settings()
    cache.invalidate()
    dispatch.clear_memo()


def shapes_file(tmp_path, text, name="shapes.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


TINY = "shapes:\n  - {B: 1, L: 16, M: 4, dtype: float32, mode: forward}\n"


# ---- profile ---------------------------------------------------------------------------------

def test_profile_real_strategies_fills_cache_and_prints_table(cache_dir, tmp_path, capsys):
    f = shapes_file(tmp_path, TINY)
    status, out, err = run(capsys, "profile", "--shapes", f, "--quick",
                           "--strategies", "serial,reference")
    assert status == 0, err
    assert "No CUDA GPU found" in out and "CPU wall times" in out
    assert "B1-L16-M4-f32-forward" in out and "n/a" in out        # no copy bandwidth on CPU
    assert "[1/1] B1-L16-M4-f32-forward" in err                    # plain progress, no TTY
    # stored under the CPU's signature only, never in a GPU's table
    assert sorted(p.name for p in cache_dir.glob("*.json")) == [f"{SIG}.json"]
    data = json.loads((cache_dir / f"{SIG}.json").read_text())
    entry = data["entries"]["B1-L16-M4-f32-forward"]
    assert entry["cpu_wall_time"] is True and entry["strategy"] in ("serial", "reference")
    # a second run takes it from the cache
    status, out, _ = run(capsys, "profile", "--shapes", f, "--quick",
                         "--strategies", "serial,reference")
    assert status == 0 and "cached" in out and "0 tuned, 1 from the cache" in out


def test_profile_json_speedups_failures_and_force(env, clock, tmp_path, capsys):
    env.add(fake("fast", 1.0), fake("slow", 3.0, priority=5),
            fake("broken", 0.5, raises=lambda: RuntimeError("out of resources")))
    f = shapes_file(tmp_path, "- {B: 2, L: 8, M: 4, dtype: float32, mode: both}\n")
    only = ("--strategies", "fast,slow,broken")     # the reference costs 0 on the fake clock
    status, out, err = run(capsys, "profile", "--shapes", f, "--json", *only)
    assert status == 0, err
    data = json.loads(out)                                         # stdout is JSON only
    assert data["signature"] == SIG and data["cpu_timings"] is True
    assert data["copy_bandwidth_bytes_per_s"] is None
    rows = {r["key"]: r for r in data["results"]}
    assert set(rows) == {"B2-L8-M4-f32-forward", "B2-L8-M4-f32-train"}
    r = rows["B2-L8-M4-f32-forward"]
    assert r["source"] == "tuned" and r["strategy"] == "fast"
    assert r["time_ms"] == pytest.approx(1.0)
    assert r["runner_up"] == "slow" and r["speedup_vs_runner_up"] == pytest.approx(3.0)
    # the rule-based default is the highest-priority eligible strategy: slow (priority 5)
    assert r["rule_default"] == "slow" and r["speedup_vs_rule_default"] == pytest.approx(3.0)
    assert r["failed"] == 1 and "out of resources" in r["failures"][0]["reason"]
    assert r["copy_bw_fraction"] is None
    assert cache.lookup(ScanProblem.from_key(r["key"], device="cpu"), SIG).strategy == "fast"

    # cached now: skipped unless --force
    status, out, _ = run(capsys, "profile", "--shapes", f, "--json", "--mode", "forward",
                         *only)
    assert [r["source"] for r in json.loads(out)["results"]] == ["cached"]
    status, out, _ = run(capsys, "profile", "--shapes", f, "--json", "--mode", "forward",
                         "--force", *only)
    assert [r["source"] for r in json.loads(out)["results"]] == ["tuned"]


def test_profile_hands_its_compile_workers_to_every_tune(env, clock, tmp_path, capsys,
                                                          monkeypatch):
    from samu_tune.cli import profile
    env.add(fake("fast", 1.0))
    seen = []
    real = profile.tune
    monkeypatch.setattr(profile, "tune", lambda *a, **kw: seen.append(kw["compile_workers"])
                        or real(*a, **kw))
    f = shapes_file(tmp_path, "- {B: 2, L: 8, M: 4, dtype: float32, mode: both}\n")
    only = ("--strategies", "fast", "--force")
    assert run(capsys, "profile", "--shapes", f, *only)[0] == 0
    assert seen == [0, 0]                         # on the CPU: none, and no note about it
    status, out, err = run(capsys, "profile", "--shapes", f, "--compile-workers", "2", *only)
    assert status == 0, err
    assert seen[2:] == [2, 2] and "in 2 worker process(es)" in out
    # every shape cached: nothing tunes, no note about workers
    status, out, err = run(capsys, "profile", "--shapes", f, "--compile-workers", "2",
                           "--strategies", "fast")
    assert status == 0, err
    assert seen[4:] == [] and "worker process" not in out and "2 from the cache" in out


def test_profile_tables_per_mode_and_no_winner(env, clock, tmp_path, capsys):
    env.add(fake("wrong", 1.0, wrong=True))
    f = shapes_file(tmp_path, "- {B: 1, L: 8, M: 4, dtype: float32, mode: both}\n")
    status, out, _ = run(capsys, "profile", "--shapes", f, "--strategies", "wrong",
                         "--show-defaults")
    assert status == 1                                             # a shape without a winner
    assert "forward: CPU wall times" in out and "train: CPU wall times" in out
    assert "none" in out and "wrong result" in out
    assert "No shipped GPU tables yet" in out


# ---- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expect", [
    (None, "no such file"),
    ("shapes: [ {B: 1", "invalid YAML at line"),
    ("shapes:\n  - {B: 1, L: 8, M: 4}\n  - {B: 1, L: 0, M: 4}\n", "entry 1: field 'L'"),
    ("shapes:\n  - {B: 1, L: 8, M: 4, dtype: int8}\n", "entry 0: field 'dtype'"),
    ("shapes:\n  - {B: 1, L: 8, M: 4, colour: red}\n", "entry 0: field 'colour'"),
    ("- {B: 1, L: 8}\n", "entry 0: field '(entry)': Value error, a scan shape needs M"),
    ("42\n", "expected a list of shapes"),
])
def test_bad_shapes_file_one_message_status_2(cache_dir, tmp_path, capsys, text, expect):
    path = str(tmp_path / "missing.yaml") if text is None else shapes_file(tmp_path, text)
    status, out, err = run(capsys, "profile", "--shapes", path)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("samu-tune: error: ")
    assert path in lines[0] and expect in lines[0] and "Traceback" not in err


def test_unknown_strategy_status_2(cache_dir, tmp_path, capsys):
    status, _, err = run(capsys, "profile", "--shapes", shapes_file(tmp_path, TINY),
                         "--strategies", "serial,nope")
    assert status == 2 and "unknown strategy 'nope'" in err and "registered:" in err


@pytest.mark.parametrize("argv", [
    ["profile"],                                                   # --shapes missing
    ["profile", "--shapes", "x.yaml", "--budget", "-1"],
    ["profile", "--shapes", "x.yaml", "--mode", "sideways"],
    ["profile", "--shapes", "x.yaml", "--compile-workers", "-1"],
    ["profile", "--shapes", "x.yaml", "--compile-workers", "many"],
    ["explain", "--B", "0", "--L", "8", "--M", "4"],
    ["explain", "--B", "1", "--L", "8", "--M", "4", "--dtype", "int8"],
    ["cache"],
    ["frobnicate"],
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_console_entry_point_subprocess(tmp_path):
    bad = shapes_file(tmp_path, "- {B: 1, L: 8, M: 4, mode: sideways}\n")
    res = subprocess.run([sys.executable, "-m", "samu_tune.cli", "profile", "--shapes", bad],
                         capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "entry 0: field 'mode'" in res.stderr and res.stdout == ""


# ---- show, strategies, explain -------------------------------------------------------------------

def _put(key, strategy="reference", sig=SIG, cpu=True, shipped_dir=None):
    e = cache.CacheEntry(key=key, mode="train" if "train" in key else "forward",
                         strategy=strategy, config={}, time_ms=2.5,
                         source_hash=registry.get(strategy).source_hash, measured_at="2026-01-01",
                         cpu_wall_time=cpu, versions=dict(cache.versions()))
    if shipped_dir is None:
        cache.put(e, sig)
        return e
    shipped_dir.mkdir(parents=True, exist_ok=True)
    data = cache.CacheFile(meta=cache.CacheMeta(signature=sig, **cache.versions()),
                           entries={key: e})
    (shipped_dir / f"{sig}.json").write_text(data.model_dump_json())
    return e


def test_show_cache_and_defaults(cache_dir, tmp_path, capsys):
    status, out, _ = run(capsys, "show")
    assert status == 0 and "No cached winners" in out and "profile" in out
    _put("B2-L8-M4-f32-forward")
    _put("B1-L16-M4-f32-train")
    status, out, _ = run(capsys, "show", "--shape", "L8")
    assert status == 0 and "B2-L8-M4-f32-forward" in out and "B1-L16" not in out
    status, out, _ = run(capsys, "show", "--json", "--mode", "train")
    assert [s["entry"]["key"] for s in json.loads(out)] == ["B1-L16-M4-f32-train"]
    status, out, _ = run(capsys, "show", "--device", "NVIDIA-H200-sm90-132sm")
    assert "No cached winners" in out and SIG in out

    status, out, _ = run(capsys, "show", "--defaults")
    assert status == 0 and "No shipped GPU tables yet" in out
    _put("B8-L4096-M512-bf16-train", "reference", sig="NVIDIA-H200-sm90-132sm", cpu=False,
         shipped_dir=tmp_path / "defaults")
    status, out, _ = run(capsys, "show", "--defaults")
    assert "NVIDIA-H200-sm90-132sm" in out and "B8-L4096-M512-bf16-train" in out


def test_strategies(capsys):
    status, out, _ = run(capsys, "strategies")
    assert status == 0
    for s in registry.all_strategies():
        assert s.name in out
    assert "deterministic" in out and "capability" in out
    status, out, _ = run(capsys, "strategies", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["reference"]["configs"] == 1 and rows["serial"]["configs"] > 1


def test_explain(cache_dir, capsys):
    argv = ["explain", "--B", "8", "--L", "4096", "--M", "512", "--dtype", "bf16",
            "--mode", "train", "--resets", "--final-state"]
    status, out, _ = run(capsys, *argv)
    assert status == 0
    assert "B8-L4096-M512-bf16-train-resets-final" in out
    for s in registry.all_strategies():
        assert s.name in out
    assert "would choose" in out and "from rule" in out and "passed over" in out
    status, out, _ = run(capsys, *argv, "--json", "--policy", "off")
    data = json.loads(out)
    assert data["source"] == "rule" and data["policy"] == "off"
    assert {r["name"] for r in data["strategies"]} == {s.name for s in registry.all_strategies()}
    # float64 is only for the reference: the others are ineligible, with reasons
    status, out, _ = run(capsys, "explain", "--B", "1", "--L", "8", "--M", "4", "--dtype",
                         "float64", "--json")
    reports = {r["name"]: r for r in json.loads(out)["strategies"]}
    assert reports["reference"]["eligible"] and not reports["serial"]["eligible"]
    assert "dtype float64" in reports["serial"]["reasons"][0]


def test_explain_layer_and_decode_ops(cache_dir, capsys):
    status, out, _ = run(capsys, "explain", "--op", "layer", "--B", "2", "--L", "64", "--M",
                         "8", "--dtype", "float32", "--json", "--device", "cpu")
    data = json.loads(out)
    assert {r["name"] for r in data["strategies"]} == {
        s.name for s in registry.all_strategies("layer")}
    # M = 8: no loop-inner config, so the fused layer is ineligible and the rule says unfused
    assert (data["strategy"], data["source"]) == ("unfused", "rule")
    assert data["problem"]["final_state"] and data["problem"]["L"] == 64
    status, out, _ = run(capsys, "explain", "--op", "layer", "--B", "2", "--L", "64", "--M",
                         "80", "--device", "cpu")
    assert status == 0 and "layer:B2-L64-M80-bf16-forward-final" in out
    assert "would choose fused" in out
    status, out, _ = run(capsys, "explain", "--op", "decode", "--B", "4", "--M", "16",
                         "--initial-state", "--json", "--device", "cpu")
    data = json.loads(out)
    assert {r["name"] for r in data["strategies"]} == {
        s.name for s in registry.all_strategies("decode")}
    assert "decode:B4-M16-bf16-h0" in out
    status, _, err = run(capsys, "explain", "--op", "decode", "--B", "4", "--L", "8", "--M",
                         "16")
    assert status == 2 and "--L" in err
    status, _, err = run(capsys, "explain", "--B", "4", "--M", "16")
    assert status == 2 and "--L is required" in err


def test_explain_linear_op(cache_dir, capsys):
    status, out, _ = run(capsys, "explain", "--op", "linear", "--B", "2", "--L", "40", "--D",
                         "20", "--dtype", "float32", "--complex", "--reverse", "--mode",
                         "train", "--json", "--device", "cpu")
    data = json.loads(out)
    assert {r["name"] for r in data["strategies"]} == {
        s.name for s in registry.all_strategies("linear")}
    assert data["problem"]["complex"] and data["problem"]["reverse"]
    assert data["problem"]["D"] == 20 and data["problem"]["backward"]
    status, out, _ = run(capsys, "explain", "--op", "linear", "--B", "2", "--L", "4000", "--D",
                         "200", "--device", "cpu")
    assert status == 0 and "linear:B2-L4000-D200-bf16-af32-real-forward" in out
    for argv, message in ((("--op", "linear", "--L", "8", "--M", "4"), "--D is required"),
                          (("--op", "linear", "--L", "8", "--D", "4", "--M", "4"),
                           "--M: --op linear takes --D"),
                          (("--op", "linear", "--L", "8", "--D", "4", "--resets"),
                           "--resets: not for --op linear"),
                          (("--L", "8", "--M", "4", "--complex"),
                           "--complex: only for --op linear")):
        status, _, err = run(capsys, "explain", "--B", "2", *argv, "--device", "cpu")
        assert status == 2 and message in err, err


# ---- cache ---------------------------------------------------------------------------------

def test_cache_commands(cache_dir, tmp_path, capsys, monkeypatch):
    status, out, _ = run(capsys, "cache", "path")
    assert status == 0 and str(cache_dir) in out and SIG in out
    _put("B2-L8-M4-f32-forward")
    exported = tmp_path / "winners.json"
    status, out, _ = run(capsys, "cache", "export", str(exported))
    assert status == 0 and "exported 1 entry" in out
    assert json.loads(exported.read_text())["meta"]["signature"] == SIG

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))            # not a terminal: no prompt
    status, _, err = run(capsys, "cache", "clear")
    assert status == 2 and "--yes" in err
    assert cache.entries(SIG)
    status, out, _ = run(capsys, "cache", "clear", "--yes")
    assert status == 0 and "removed 1" in out and not cache.entries(SIG)

    status, out, _ = run(capsys, "cache", "import", str(exported))
    assert status == 0 and "imported 1" in out and len(cache.entries(SIG)) == 1
    status, _, err = run(capsys, "cache", "import", str(tmp_path / "nope.json"))
    assert status == 2 and "no such cache file" in err
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    status, _, err = run(capsys, "cache", "import", str(junk))
    assert status == 2 and "junk.json" in err and "Traceback" not in err


def test_cache_commands_leave_the_verdict_files_alone(cache_dir, tmp_path, capsys):
    """The tuner's verdict file beside the winner caches is not a device's cache: ``show
    --all``, ``cache clear --all`` and the listings neither read it as one nor move it aside."""
    from samu_tune import verified
    _put("B2-L8-M4-f32-forward")
    vfile = verified.path(SIG)
    text = json.dumps({"format": 1, "entries": {}})
    vfile.write_text(text)
    assert cache.signatures() == [SIG]
    status, out, err = run(capsys, "show", "--all")
    assert status == 0 and "unusable" not in out + err
    status, out, _ = run(capsys, "cache", "clear", "--all", "--yes")
    assert status == 0 and "removed 1" in out
    assert vfile.read_text() == text
    assert not list(cache_dir.glob("*.corrupt*"))


def test_cache_commands_name_other_devices_files(cache_dir, tmp_path, capsys):
    """A command on this device's (empty) cache names the devices whose cache files exist:
    ``profile`` on a CPU stores under ``cpu-interpreter``."""
    _put("B2-L8-M4-f32-forward")                                 # this device's (SIG)
    status, out, _ = run(capsys, "cache", "export", str(tmp_path / "w.json"), "--device",
                         "other-gpu")
    assert status == 0 and "exported 0 entries" in out and SIG in out and "--device" in out
    status, out, _ = run(capsys, "cache", "path", "--device", "other-gpu")
    assert status == 0 and f"other devices: {SIG}" in out


def test_cpu_timings_never_enter_a_gpu_table(cache_dir, tmp_path):
    with pytest.raises(ValueError, match="CPU wall time"):
        _put("B2-L8-M4-f32-forward", sig="NVIDIA-H200-sm90-132sm", cpu=True)
    exported = tmp_path / "cpu.json"
    _put("B2-L8-M4-f32-forward")
    cache.export(exported, SIG)
    with pytest.raises(ValueError, match="CPU wall time"):
        cache.import_(exported, signature="NVIDIA-H200-sm90-132sm")
    assert not (cache_dir / "NVIDIA-H200-sm90-132sm.json").exists()


def test_copy_bandwidth_fraction():
    from samu_tune.cli import bandwidth
    p = ScanProblem(B=8, L=4096, M=512, dtype="bfloat16", backward=False)
    assert bandwidth.moved_bytes(p) == 4 * 8 * 4096 * 512 * 2
    assert bandwidth.moved_bytes(p.model_copy(update={"backward": True})) == 10 * 8 * 4096 * 512 * 2
    t_copy = bandwidth.moved_bytes(p) / 4e12 * 1e3                # ms at 4 TB/s
    assert bandwidth.fraction(p, 2 * t_copy, 4e12) == pytest.approx(0.5)
    assert bandwidth.fraction(p, 1.0, None) is None and bandwidth.fraction(p, None, 4e12) is None


@pytest.mark.gpu
def test_profile_on_gpu_reports_bandwidth(cache_dir, tmp_path, capsys):
    f = shapes_file(tmp_path, "- {B: 2, L: 1024, M: 256, dtype: bfloat16, mode: forward}\n")
    status, out, err = run(capsys, "profile", "--shapes", f, "--quick", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["cpu_timings"] is False and not data["signature"].startswith("cpu")
    assert data["copy_bandwidth_bytes_per_s"] > 1e11
    row = data["results"][0]
    assert row["source"] == "tuned" and 0 < row["copy_bw_fraction"] < 2
    assert (cache_dir / f"{data['signature']}.json").exists()
    status, out, _ = run(capsys, "profile", "--shapes", f, "--quick")
    assert status == 0 and "copy bandwidth" in out and "cached" in out


def test_profile_without_interpreter_reruns_under_it(tmp_path):
    """Triton picks the interpreter when kernels are defined: profile re-runs itself with
    TRITON_INTERPRET=1 when no GPU is found and the variable is unset."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SAMU_TUNE_CACHE_DIR"] = str(tmp_path / "cache")
    f = shapes_file(tmp_path, "- {B: 1, L: 4, M: 2, dtype: float32, mode: forward}\n")
    res = subprocess.run([sys.executable, "-m", "samu_tune.cli", "profile", "--shapes", f,
                          "--json", "--strategies", "serial", "--max-configs", "1"],
                         capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1])
    assert res.returncode == 0, res.stderr
    assert "TRITON_INTERPRET=1" in res.stderr
    data = json.loads(res.stdout)
    assert data["device"]["interpret"] is True and data["signature"] == SIG
    assert data["results"][0]["strategy"] == "serial"


def test_profile_under_torchrun_shards_the_problems_and_every_rank_stores_all(tmp_path):
    """Two gloo ranks (as `torchrun --nproc-per-node 2 -m samu_tune.cli profile` starts
    them): each tunes every second problem, rank 0 prints all results, and each rank's own
    cache (separate dirs, as on separate hosts) ends with every winner."""
    import json
    import socket
    import subprocess
    import sys
    from pathlib import Path
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("shapes:\n  - {B: [1, 2], L: 8, M: 4, dtype: float32, mode: forward}\n"
                      "  - {B: 3, L: [8, 9], M: 4, dtype: float32, mode: forward}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    worker = Path(__file__).with_name("_profile_rank.py")
    procs = [subprocess.Popen([sys.executable, str(worker), str(r), "2", port, str(tmp_path),
                               str(shapes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    results = json.loads(outs[0][0])["results"]
    keys = [r["key"] for r in results]
    assert len(keys) == 4 and all(r["source"] == "tuned" for r in results)
    assert outs[1][0].strip() == ""                       # only rank 0 prints
    for rank in range(2):
        files = list((tmp_path / f"rank{rank}").glob("*.json"))
        assert len(files) == 1
        stored = json.loads(files[0].read_text())["entries"]
        assert sorted(stored) == sorted(keys)


def test_progress_reports_the_best_so_far_and_what_is_left(monkeypatch, capsys):
    from samu_tune.cli import progress as prog
    from samu_tune.results import TuneEvent
    now = [100.0]
    monkeypatch.setattr(prog.time, "monotonic", lambda: now[0])
    p = prog.ProfileProgress(3)
    p.live = False

    def ev(event, i, name, ms=None):
        return TuneEvent(event=event, phase="screen", candidate=name, strategy=name, config={},
                         index=i, total=2, elapsed_s=0.0, status="ok" if ms else None,
                         time_ms=ms)
    p.shape_start(1, "B1-L64-M8-f32-forward")
    assert p.left_s() is None and "left" not in p.status()
    p.event(ev("start", 1, "a"))
    p.event(ev("finish", 1, "a", 2.0))
    p.event(ev("start", 2, "b"))
    p.event(ev("finish", 2, "b", 1.5))
    assert "screen 2/2 b" in p.status() and "best 1.5 ms b" in p.status()
    now[0] += 10
    p.shape_done("b 1.5 ms")
    assert "[1/3] B1-L64-M8-f32-forward: b 1.5 ms (~20 s left)" in capsys.readouterr().err
    p.shape_start(2, "B2-L64-M8-f32-forward")
    now[0] += 4
    assert p.left_s() == pytest.approx(6 + 10)     # this shape's mean rest, then one more
    # a shape served from the cache finishes at once and does not lower the mean
    p.shape_done("cached", tuned=False)
    p.shape_start(3, "B3-L64-M8-f32-forward")
    now[0] += 1
    assert p.left_s() == pytest.approx(10 - 1)


def test_ranks_get_whole_shapes_forward_and_train_together():
    from samu_tune.cli.profile import _shard
    from samu_tune.ops.decode.problem import DecodeProblem
    fwd = [ScanProblem(B=b, L=8, M=4, dtype="float32", device="cpu") for b in (1, 2, 3)]
    problems = [q for p in fwd for q in (p, p.model_copy(update={"backward": True}))]
    problems.append(DecodeProblem(B=4, M=8, device="cpu"))        # no backward field
    shards = [_shard(problems, r, 2) for r in range(2)]
    assert shards == [[0, 1, 4, 5], [2, 3, 6]]
    assert sorted(shards[0] + shards[1]) == list(range(len(problems)))
    assert _shard(problems, 0, 1) == list(range(len(problems)))
