"""``tools/ship_defaults``: a shipped table built from a benchmark keeps the existing table's
other entries, and refuses (writing nothing) an existing file it cannot read or that holds
another GPU's table."""
import json

import pytest

from samu_tune import cache
from samu_tune.ops.scan.strategies.lookback_config import LookbackConfig
from tools import ship_defaults

SIG = "TEST-GPU-sm90-132sm"
H200 = ship_defaults.ROOT / "samu_tune" / "defaults" / "NVIDIA-H200-sm90-132sm.json"


def _bench(tmp_path, shapes, ms=0.5):
    rows = [{"kind": "strategy", "name": "lookback", "config": LookbackConfig().model_dump(),
             "shape": list(s), "dtype": "bfloat16", "forward_ms": ms, "train_ms": 2 * ms}
            for s in shapes]
    path = tmp_path / f"bench{len(shapes)}{ms}.json"
    path.write_text(json.dumps({"signature": SIG, "samu_tune": "0.1.0", "torch": "2.11",
                                "triton": "3.6", "started": "2026-12-06 00:00:00",
                                "rows": rows}))
    return path


def _table(root):
    return root / "samu_tune" / "defaults" / f"{SIG}.json"


def test_merge_keeps_other_entries_and_refuses_unreadable(tmp_path):
    root = tmp_path / "root"
    _table(root).parent.mkdir(parents=True)
    ship_defaults.main([str(_bench(tmp_path, [(1, 2048, 64), (2, 4096, 128)]))], root=root)
    table = cache.CacheFile.model_validate_json(_table(root).read_text())
    decode = next(e for k, e in cache.CacheFile.model_validate_json(
        H200.read_text()).entries.items() if k.startswith("decode:"))
    table.entries[decode.key] = decode
    _table(root).write_text(table.model_dump_json())

    # a new run of one shape: its two entries replaced, the other shape's and decode kept
    ship_defaults.main([str(_bench(tmp_path, [(1, 2048, 64)], ms=0.25))], root=root)
    merged = cache.CacheFile.model_validate_json(_table(root).read_text()).entries
    assert set(merged) == set(table.entries)
    assert merged["B1-L2048-M64-bf16-forward"].time_ms == 0.25
    assert merged["B2-L4096-M128-bf16-forward"].time_ms == 0.5
    assert decode.key in merged

    # --replace: the benchmark's entries alone
    ship_defaults.main([str(_bench(tmp_path, [(1, 2048, 64)])), "--replace"], root=root)
    assert len(cache.CacheFile.model_validate_json(_table(root).read_text()).entries) == 2

    # unreadable, or another GPU's table: nothing written
    for text in ("{not json", H200.read_text()):
        _table(root).write_text(text)
        with pytest.raises(SystemExit, match="--replace"):
            ship_defaults.main([str(_bench(tmp_path, [(1, 2048, 64)]))], root=root)
        assert _table(root).read_text() == text
