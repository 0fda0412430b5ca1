"""Build a shipped winner table (``samu_tune/defaults/<signature>.json``) from a bench.json.

    python scripts/ship_defaults.py scripts/results/NVIDIA-H200/grid/bench.json
    python scripts/ship_defaults.py --restamp samu_tune/defaults/NVIDIA-H200-sm90-132sm.json

For every (shape, dtype, mode) of the benchmark, the fastest timed registered strategy and
config wins; the runner-up is the fastest of a different strategy or config.  The file has the
user cache's format (:mod:`samu_tune.cache`), with the versions the benchmark ran under.

``--restamp TABLE``: set every entry's ``source_hash`` to its strategy's current one, after an
edit that leaves the kernels' code as measured (docstrings, comments): the table otherwise
reads as stale.  Nothing else in the table changes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from samu_tune import cache, registry  # noqa: E402
from samu_tune.problem import ScanProblem  # noqa: E402


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


def restamp(path: Path) -> int:
    """Re-stamp the entries of the table at ``path`` in place; returns how many changed."""
    table = cache.CacheFile.model_validate_json(path.read_text())
    changed = 0
    for e in table.entries.values():
        current = registry.get(e.strategy, e.op).source_hash
        if e.source_hash != current:
            e.source_hash = current
            changed += 1
    path.write_text(table.model_dump_json(indent=1))
    return changed


def main(argv=None) -> None:
    args = argv or sys.argv[1:]
    if args[0] == "--restamp":
        n = restamp(Path(args[1]))
        print(f"{args[1]}: {n} entries re-stamped")
        return
    src = Path(args[0])
    data = json.loads(src.read_text())
    meta = cache.CacheMeta(signature=data["signature"], samu_tune=data["samu_tune"],
                           torch=data["torch"], triton=data["triton"], written_at=data["started"])
    table = cache.CacheFile(meta=meta, entries=entries(data))
    dest = ROOT / "samu_tune" / "defaults" / f"{data['signature']}.json"
    dest.write_text(table.model_dump_json(indent=1))
    print(f"{dest}: {len(table.entries)} entries")
    for e in table.entries.values():
        print(f"  {e.key:28s} {e.strategy:10s} {e.time_ms:7.3f} ms  {e.config}")


if __name__ == "__main__":
    main()
