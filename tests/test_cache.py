"""The on-disk cache: round trip, concurrent writers, corruption, serving rules, sharing."""
import json
import multiprocessing
import warnings

import pytest

import samu_tune
from samu_tune import cache, registry
from samu_tune.ops.scan.problem import ScanProblem

from _fakes import clock, env, fake  # noqa: F401  (fixtures)

SIG = "cpu-interpreter"
FWD = ScanProblem(B=2, L=6, M=4, dtype="float32", device="cpu", backward=False)


def _entry(key="B2-L6-M4-f32-forward", strategy="reference", config=None, when="2026-01-01",
           **over):
    fields = dict(key=key, mode="train" if "train" in key else "forward", strategy=strategy,
                  config=config or {}, time_ms=1.0, source_hash=registry.get(strategy).source_hash,
                  measured_at=when, cpu_wall_time=True, versions=dict(cache.versions()))
    fields.update(over)
    return cache.CacheEntry(**fields)


def test_round_trip_with_metadata(env, clock):
    env.add(fake("fast", 1.0), fake("slow", 3.0))
    result = samu_tune.tune(FWD, strategies=["fast", "slow"], reps=1)
    assert result.device.signature() == SIG
    entry = cache.record(result)
    assert cache.path() == env.cache_dir / f"{SIG}.json"
    data = json.loads(cache.path().read_text())
    meta = data["meta"]
    assert meta["signature"] == SIG and meta["device"]["interpret"] is True
    for name in ("samu_tune", "torch", "triton"):
        assert meta[name] == cache.versions()[name]
    raw = data["entries"][FWD.key()]
    assert raw["strategy"] == "fast" and raw["runner_up"]["strategy"] == "slow"
    assert raw["cpu_wall_time"] is True and raw["source_hash"] == registry.get("fast").source_hash
    assert raw["time_ms"] == pytest.approx(1.0) and raw["mode"] == "forward"
    cache.invalidate()  # a new process: read from disk
    got = cache.lookup(FWD)
    assert got == entry
    listed = cache.entries()
    assert [(s.entry.key, s.served, s.signature) for s in listed] == [(FWD.key(), True, SIG)]
    assert cache.signatures() == [SIG]


def _writer(cache_dir, worker, n):
    import os
    os.environ["SAMU_TUNE_CACHE_DIR"] = cache_dir
    from samu_tune import cache as c, settings
    settings.reload_settings()
    c.invalidate()
    for i in range(n):
        e = c.CacheEntry(key=f"B{worker + 1}-L{i + 1}-M4-f32-forward", mode="forward",
                         strategy="reference", config={}, time_ms=1.0, source_hash="x",
                         measured_at="2026", cpu_wall_time=True, versions=c.versions())
        c.put(e, "cpu-interpreter")


def test_concurrent_writers_lose_nothing(env):
    ctx = multiprocessing.get_context("fork")
    workers, n = 4, 8
    procs = [ctx.Process(target=_writer, args=(str(env.cache_dir), w, n)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache.invalidate()
    keys = {s.entry.key for s in cache.entries(SIG)}
    assert keys == {f"B{w + 1}-L{i + 1}-M4-f32-forward" for w in range(workers) for i in range(n)}
    assert not list(env.cache_dir.glob("*.tmp"))


def test_corrupt_file_is_reported_once_on_the_console(tmp_path):
    """A program without logging set up sees the report once (the warning), not also
    through logging's last-resort handler."""
    import subprocess
    import sys
    code = ("from samu_tune import cache; p = cache.path('cpu-interpreter'); "
            "p.parent.mkdir(parents=True); p.write_text('{ not json'); "
            "cache.lookup(cache.problem_from_key('B2-L8-M4-f32-forward'), 'cpu-interpreter')")
    env = dict(__import__("os").environ, SAMU_TUNE_CACHE_DIR=str(tmp_path / "c"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("unusable") == 1, res.stderr


def test_corrupt_file_is_moved_aside_once_and_not_fatal(env):
    p = cache.path(SIG)
    p.parent.mkdir(parents=True)
    p.write_text("{ not json")
    with pytest.warns(cache.CacheWarning, match="unusable"):
        assert cache.lookup(FWD, SIG) is None
    aside = list(env.cache_dir.glob(f"{SIG}.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{ not json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once: no second warning
        assert cache.lookup(FWD, SIG) is None
        cache.put(_entry(), SIG)
        assert cache.lookup(FWD, SIG).strategy == "reference"
    # a valid JSON file of the wrong shape, and a foreign signature, are unusable too
    for text in ('{"meta": 3}', p.read_text().replace(f'"{SIG}"', '"NVIDIA-X-sm90-1sm"')):
        p.write_text(text)
        cache.invalidate()
        with pytest.warns(cache.CacheWarning):
            assert cache.lookup(FWD, SIG) is None
    assert len(list(env.cache_dir.glob(f"{SIG}.json.corrupt-*"))) == 3


def test_version_mismatch_and_stale_entries_are_not_served(env):
    env.add(fake("gone"), fake("edited"))
    other_torch = dict(cache.versions(), torch="1.0.0")
    entries = [
        _entry("B1-L8-M4-f32-forward", versions=other_torch),
        _entry("B2-L8-M4-f32-forward", versions=dict(cache.versions(), samu_tune="0.0.1")),
        _entry("B3-L8-M4-f32-forward", strategy="edited", source_hash="0123456789abcdef"),
        _entry("B4-L8-M4-f32-forward", strategy="gone"),
        _entry("B5-L8-M4-f32-forward"),
    ]
    for e in entries:
        cache.put(e, SIG)
    registry.unregister("gone")
    status = {s.entry.key: s for s in cache.entries(SIG)}
    assert "torch 1.0.0" in status["B1-L8-M4-f32-forward"].reason
    assert "samu_tune 0.0.1" in status["B2-L8-M4-f32-forward"].reason
    assert "source hash" in status["B3-L8-M4-f32-forward"].reason
    assert "not registered" in status["B4-L8-M4-f32-forward"].reason
    assert status["B5-L8-M4-f32-forward"].served
    for key in ("B1", "B2", "B3", "B4"):
        assert cache.lookup(ScanProblem.from_key(f"{key}-L8-M4-f32-forward", "cpu"), SIG) is None
    assert cache.lookup(ScanProblem.from_key("B5-L8-M4-f32-forward", "cpu"), SIG) is not None
    # nearest never returns an unserved entry
    near = cache.nearest(ScanProblem.from_key("B1-L9-M4-f32-forward", "cpu"), SIG)
    assert [e.key for _, e in near] == ["B5-L8-M4-f32-forward"]


def test_shipped_tables_accept_other_versions_but_need_the_strategy(env):
    env.add(fake("edited"))
    shipped = cache.CacheFile(meta=cache.CacheMeta(signature=SIG, samu_tune="0.0.1",
                                                   torch="1.0", triton="2.0"), entries={})
    old = dict(samu_tune="0.0.1", torch="1.0", triton="2.0")
    for e in (_entry("B1-L8-M4-f32-forward", strategy="edited", source_hash="old", versions=old),
              _entry("B2-L8-M4-f32-forward", strategy="edited",
                     config={"nope": 1}, versions=old)):
        shipped.entries[e.key] = e
    entry = _entry("B3-L8-M4-f32-forward", versions=old).model_copy(
        update={"strategy": "never_registered"})
    shipped.entries[entry.key] = entry
    cache.DEFAULTS_DIR.mkdir(parents=True)
    cache.shipped_path(SIG).write_text(shipped.model_dump_json())
    served = {s.entry.key: s for s in cache.entries(SIG, include_shipped=True) if s.shipped}
    assert served["B1-L8-M4-f32-forward"].served
    assert "does not parse" in served["B2-L8-M4-f32-forward"].reason
    assert "not registered" in served["B3-L8-M4-f32-forward"].reason
    problem = ScanProblem.from_key("B1-L8-M4-f32-forward", "cpu")
    assert cache.lookup(problem, SIG, shipped=True).strategy == "edited"
    assert cache.lookup(problem, SIG) is None


def test_export_import_merge_and_clear(env, tmp_path):
    a, b = _entry("B1-L8-M4-f32-forward"), _entry("B2-L8-M4-f32-forward")
    cache.put(a, SIG)
    cache.put(b, SIG)
    exported = tmp_path / "table.json"
    assert cache.export(exported, SIG) == 2
    assert cache.clear(SIG) == 2 and cache.entries(SIG) == []
    assert cache.import_(exported) == 2
    assert {s.entry.key for s in cache.entries(SIG)} == {a.key, b.key}
    # merge: for a key in both files the entry measured last wins
    newer = _entry("B1-L8-M4-f32-forward", when="2026-06-01", time_ms=0.5)
    other = tmp_path / "other.json"
    other.write_text(cache.CacheFile(meta=cache.CacheMeta(
        signature=SIG, **cache.versions()), entries={newer.key: newer}).model_dump_json())
    merged = tmp_path / "merged.json"
    assert cache.merge([exported, other], merged) == 2
    data = cache.CacheFile.model_validate_json(merged.read_text())
    assert data.entries[newer.key].time_ms == 0.5
    assert cache.merge([other]) == 1  # into the cache
    assert cache.lookup(ScanProblem.from_key(newer.key, "cpu"), SIG).time_ms == 0.5
    # an older entry does not replace a newer one
    assert cache.import_(exported) == 0
    foreign = tmp_path / "foreign.json"
    foreign.write_text(other.read_text().replace(f'"{SIG}"', '"NVIDIA-X-sm90-1sm"'))
    with pytest.raises(ValueError, match="signature"):
        cache.merge([exported, foreign], tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("junk")
    with pytest.raises(ValueError, match="junk.json"):
        cache.import_(tmp_path / "junk.json")
    assert cache.remove([a.key], SIG) == 1
    assert cache.clear(all_devices=True) == 1


def test_index_reloads_on_mtime_change_at_most_every_n_seconds(env, monkeypatch):
    problem = ScanProblem.from_key("B1-L8-M4-f32-forward", "cpu")
    assert cache.lookup(problem, SIG) is None
    gen = cache.generation(SIG)
    # another process writes the file
    cache.path(SIG).parent.mkdir(parents=True)
    data = cache.CacheFile(meta=cache.CacheMeta(signature=SIG, **cache.versions()),
                           entries={problem.key(): _entry(problem.key())})
    cache.path(SIG).write_text(data.model_dump_json())
    monkeypatch.setattr(cache, "RELOAD_CHECK_S", 3600.0)
    assert cache.lookup(problem, SIG) is None  # not checked again yet
    assert cache.generation(SIG) == gen
    monkeypatch.setattr(cache, "RELOAD_CHECK_S", 0.0)
    assert cache.lookup(problem, SIG) is not None
    assert cache.generation(SIG) != gen


def test_every_shipped_table_entry_is_served():
    # the tables in samu_tune/defaults/: each entry's strategy is registered and its config
    # parses (a config field renamed or a value dropped from a Literal would silently drop
    # the entry), and its key is the one its problem gives
    files = sorted(cache.DEFAULTS_DIR.glob("*.json"))
    assert files
    for p in files:
        table = cache._read_any(p)
        assert table.entries, p
        for key, entry in table.entries.items():
            assert entry.key == key
            assert cache.why_not_served(entry, shipped=True) is None, (p.name, key)
