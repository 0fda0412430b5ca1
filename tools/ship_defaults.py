"""Build a shipped winner table (``samu_tune/defaults/<signature>.json``) from a bench.json.

    python -m tools.ship_defaults benchmarks/results/NVIDIA-H200/s16/final/grid/bench.json

(the shipped H200 table's decode entries are ``tools/tune_decode.py``'s winners, merged in from
its cache file ``benchmarks/results/NVIDIA-H200/s13/decode/cache/``).  The command replaces the
entries of the cases the benchmark timed and keeps every other entry of an existing table of
the same signature (decode entries, shapes the benchmark did not run), listing them.

For every (shape, dtype, mode) of the benchmark, the fastest timed registered strategy and
config wins; the runner-up is the fastest of a different strategy or config.  The file has the
user cache's format (:mod:`samu_tune.cache`), with the versions the benchmark ran under.

Each entry records its strategy's ``source_hash`` when the table is built: the hash ignores
docstrings, comments and where modules live (:func:`samu_tune.registry.code_text`), so only a
code change makes an entry read as measured on older code (shipped entries are served anyway).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from samu_tune import cache, registry
from samu_tune.ops.scan.problem import ScanProblem

ROOT = Path(__file__).resolve().parents[1]


def entries(data: dict) -> dict[str, cache.CacheEntry]:
    versions = {"samu_tune": data["samu_tune"], "torch": data["torch"], "triton": data["triton"]}
    groups: dict[tuple, list[dict]] = {}
    for r in data["rows"]:
        if r["kind"] != "strategy":
            continue
        for mode in ("forward", "train"):
            if f"{mode}_ms" in r:
                groups.setdefault((tuple(r["shape"]), r["dtype"], mode), []).append(r)
    out = {}
    for (shape, dtype, mode), rows in sorted(groups.items()):
        rows = sorted(rows, key=lambda r: r[f"{mode}_ms"])
        best, rest = rows[0], rows[1:]
        B, L, M = shape
        key = ScanProblem(B=B, L=L, M=M, dtype=dtype, device="cuda",
                          backward=mode == "train").key()
        runner = rest[0] if rest else None
        out[key] = cache.CacheEntry(
            key=key, mode=mode, strategy=best["name"], config=best["config"],
            time_ms=best[f"{mode}_ms"],
            runner_up=None if runner is None else cache.RunnerUp(
                strategy=runner["name"], config=runner["config"], time_ms=runner[f"{mode}_ms"]),
            margin=None if runner is None else runner[f"{mode}_ms"] / best[f"{mode}_ms"] - 1,
            source_hash=registry.get(best["name"]).source_hash, measured_at=data["started"],
            cpu_wall_time=False, versions=versions, search="bench")
    return out


def _existing(dest: Path, signature: str) -> cache.CacheFile:
    """The table at ``dest``; SystemExit naming the file when it does not parse or is
    another signature's."""
    try:
        old = cache.CacheFile.model_validate_json(dest.read_text())
    except ValueError as exc:
        raise SystemExit(f"{dest}: not a table ({str(exc).splitlines()[0]}); fix it or pass "
                         f"--replace") from None
    if old.meta.signature != signature:
        raise SystemExit(f"{dest}: holds {old.meta.signature!r}'s table, not {signature!r}; "
                         f"pass --replace to overwrite it")
    return old


def main(argv=None, root: Path = ROOT) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path, help="a bench.json of benchmarks/bench_scan.py")
    ap.add_argument("--replace", action="store_true",
                    help="write the benchmark's entries alone, dropping the existing table's")
    args = ap.parse_args(argv)
    src = args.bench_json
    data = json.loads(src.read_text())
    meta = cache.CacheMeta(signature=data["signature"], samu_tune=data["samu_tune"],
                           torch=data["torch"], triton=data["triton"], written_at=data["started"])
    new = entries(data)
    dest = root / "samu_tune" / "defaults" / f"{data['signature']}.json"
    kept = {}
    if dest.exists() and not args.replace:
        old = _existing(dest, data["signature"])
        kept = {k: e for k, e in old.entries.items() if k not in new}
    table = cache.CacheFile(meta=meta, entries={**kept, **new})
    dest.write_text(table.model_dump_json(indent=1))
    print(f"{dest}: {len(table.entries)} entries ({len(kept)} kept from the existing table: "
          f"{', '.join(kept) or 'none'})")
    for e in new.values():
        print(f"  {e.key:28s} {e.strategy:10s} {e.time_ms:7.3f} ms  {e.config}")


if __name__ == "__main__":
    main()
