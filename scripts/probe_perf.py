"""Scratch GPU probe: spill-free lookback configs and the chunk family at the long-L shapes.

    python scripts/probe_perf.py [--out DIR]

Times forward and forward+backward (samu_tune.timing: L2 flushed, rotating inputs) and prints
the fraction of copy bandwidth (forward 4 arrays of [B, L, M], forward+backward 10).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lookback import copy_bandwidth_tbps, time_mode  # noqa: E402
from samu_tune import registry  # noqa: E402
from samu_tune.problem import ScanProblem  # noqa: E402

SHAPES = [(8, 8192, 1024), (1, 16384, 256), (2, 65536, 128), (32, 512, 256)]
LOOKBACK = [(32, 32, 4, 1), (32, 32, 4, 4), (32, 32, 4, 16), (16, 64, 4, 1), (16, 64, 4, 4),
            (16, 64, 4, 16), (64, 16, 4, 4), (16, 128, 2, 1), (16, 128, 2, 4), (64, 32, 4, 4)]
FAMILY = ()


def candidates(problem):
    out = []
    lb = registry.get("lookback")
    for chunk, bm, w, sub in LOOKBACK:
        cfg = lb.config_model(chunk=chunk, block_m=bm, num_warps=w, sub=sub)
        if lb.valid(problem, cfg):
            out.append((lb, cfg))
    for name in FAMILY:
        s = registry.get(name)
        d = s.default_config(problem)
        out.append((s, d))
        if name == "chunk":
            for upd in ({"intra": "walk"}, {"chunk": 64, "num_warps": 8},
                        {"block_m": 64, "num_warps": 8}):
                cfg = d.model_copy(update=upd)
                if s.valid(problem, cfg):
                    out.append((s, cfg))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bw = copy_bandwidth_tbps()
    print(f"copy bandwidth {bw:.2f} TB/s", flush=True)
    rows = []
    for B, L, M in SHAPES:
        problem = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cuda")
        nbytes = B * L * M * 2
        print(f"== {B, L, M}", flush=True)
        for strat, cfg in candidates(problem):
            row = dict(shape=[B, L, M], strategy=strat.name, config=cfg.model_dump())
            try:
                row["first_fwd_s"], row["fwd_ms"] = time_mode(strat, cfg, problem, False)[:2]
                row["first_train_s"], row["train_ms"] = time_mode(strat, cfg, problem, True)[:2]
                fb = 4 * nbytes / (row["fwd_ms"] * 1e-3) / (bw * 1e12)
                tb = 10 * nbytes / (row["train_ms"] * 1e-3) / (bw * 1e12)
                print(f"{strat.name:12s} {str(cfg.model_dump()):110s} fwd {row['fwd_ms']:.3f} "
                      f"({100 * fb:3.0f}%) train {row['train_ms']:.3f} ({100 * tb:3.0f}%) "
                      f"first {row['first_fwd_s']:.1f}+{row['first_train_s']:.1f}s", flush=True)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(f"{strat.name} {cfg} FAILED {row['error']}", flush=True)
            rows.append(row)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_perf.json").write_text(json.dumps(dict(copy_tbps=bw, rows=rows), indent=1))


if __name__ == "__main__":
    main()
