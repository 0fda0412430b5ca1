"""Tables and a chart from a bench.json written by benchmarks/bench_scan.py.

    python -m benchmarks.bench_report benchmarks/results/<gpu>/<run>/grid/bench.json

writes bench.md (markdown, shown by the README) and bench.png beside the JSON.  For each shape:
every strategy at its best timed config, the tuned ``samu_tune.scan``, the seed's default
dispatch and best variant, accelerated-scan; ms, % of copy bandwidth, ratios.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def best_rows(rows, mode):
    """{(shape, dtype): {label: row}} keeping each label's fastest row in ``mode``."""
    table = defaultdict(dict)
    for r in rows:
        if f"{mode}_ms" not in r:
            continue
        label = {"strategy": r["name"], "scan": "samu_tune.scan", "accel": "accelerated_scan",
                 "seed": r["name"]}[r["kind"]]
        key = (tuple(r["shape"]), r["dtype"])
        cur = table[key].get(label)
        if cur is None or r[f"{mode}_ms"] < cur[f"{mode}_ms"]:
            table[key][label] = r
    return table


def geomean(xs):
    xs = [x for x in xs if x and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def render(data) -> tuple[str, dict]:
    rows = data["rows"]
    lines = [f"Device: {data['device']} ({data['sm_count']} SMs), torch {data['torch']}, "
             f"triton {data['triton']}; copy bandwidth {data['copy_tbps']:.2f} TB/s. "
             + ("Median GPU time (the tuner's clock: CUDA events around each call queued "
                "behind a GPU busy-wait, so host launch time is excluded), L2 flushed. "
                if any("forward_host_ms" in r for r in rows) else
                "Median of CUDA-event timings, L2 flushed (host launch time included where "
                "it exceeds the flush). ")
             + "% bw: forward counts 4 arrays of [B,L,M], forward+backward 10."]
    if not any(r["kind"] == "scan" for r in rows):
        lines.append("samu_tune.scan was not timed in this run: the ratios compare the best "
                     "timed candidate (the entry the shipped table dispatches to).")
    lines.append("")
    summary = {}
    for mode, title in (("forward", "Forward"), ("train", "Forward + backward")):
        table = best_rows(rows, mode)
        lines += [f"### {title}", "",
                  "| shape (B,L,M) dtype | best strategy | ms | % bw | samu_tune.scan ms | "
                  "seed default ms | seed best ms | accel-scan ms | x seed default | "
                  "x seed best | x accel |", "|---" * 11 + "|"]
        ratios = defaultdict(list)
        for (shape, dtype), cands in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            ours = {k: v for k, v in cands.items()
                    if not k.startswith("seed") and k not in ("accelerated_scan",)}
            if not ours:
                continue
            scan_row = ours.get("samu_tune.scan")
            best_label, best = min(((k, v) for k, v in ours.items() if k != "samu_tune.scan"),
                                   key=lambda kv: kv[1][f"{mode}_ms"])
            mine = scan_row or best
            t = mine[f"{mode}_ms"]
            seed_default = cands.get("seed_default", {}).get(f"{mode}_ms")
            seeds = [v[f"{mode}_ms"] for k, v in cands.items() if k.startswith("seed")]
            seed_best = min(seeds) if seeds else None
            accel = cands.get("accelerated_scan", {}).get(f"{mode}_ms")

            def fmt(x):
                return f"{x:.3f}" if x else "—"

            def ratio(x, key):
                if not x:
                    return "—"
                ratios[key].append(x / t)
                return f"{x / t:.2f}"
            lines.append(
                f"| {shape} {dtype} | {best_label} | {best[f'{mode}_ms']:.3f} | "
                f"{100 * best[f'{mode}_bw_frac']:.0f}% | {fmt(scan_row and scan_row[f'{mode}_ms'])} | "
                f"{fmt(seed_default)} | {fmt(seed_best)} | {fmt(accel)} | "
                f"{ratio(seed_default, 'seed_default')} | {ratio(seed_best, 'seed_best')} | "
                f"{ratio(accel, 'accel')} |")
        gm = {k: geomean(v) for k, v in ratios.items()}
        summary[mode] = gm
        lines += ["", "Geometric mean speedups (" + title.lower() + "): "
                  + ", ".join(f"x {k} {v:.2f}" for k, v in gm.items()), ""]
    comp = defaultdict(float)
    for r in rows:
        if r["kind"] == "strategy" and r.get("compile_s"):
            comp[r["name"]] = max(comp[r["name"]], r["compile_s"])
    if comp:
        lines += ["### Compile (first call, forward+backward, all kernels of one config, s)", "",
                  "| strategy | max over configs and shapes |", "|---|---|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in sorted(comp.items())]
    return "\n".join(lines) + "\n", summary


def chart(data, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(12, 8))
    for ax, mode in zip(axes, ("forward", "train")):
        table = best_rows(data["rows"], mode)
        keys = [k for k in sorted(table, key=lambda k: (k[1], k[0])) if k[1] == "bfloat16"]
        labels = sorted({lab for k in keys for lab in table[k]})
        width = 0.8 / max(1, len(labels))
        for j, lab in enumerate(labels):
            ys = [100 * table[k][lab].get(f"{mode}_bw_frac", 0) if lab in table[k] else 0
                  for k in keys]
            ax.bar([i + j * width for i in range(len(keys))], ys, width, label=lab)
        ax.set_xticks([i + 0.4 for i in range(len(keys))])
        ax.set_xticklabels([str(k[0]) for k in keys], fontsize=8)
        ax.set_ylabel("% of copy bandwidth")
        ax.set_title(f"{mode} (bf16), {data['device']}")
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path, help="a bench.json of benchmarks/bench_scan.py")
    path = ap.parse_args(argv).bench_json
    data = json.loads(path.read_text())
    md, summary = render(data)
    (path.parent / "bench.md").write_text(md)
    try:
        chart(data, path.parent / "bench.png")
    except ImportError:
        print("matplotlib missing: no chart")
    print(md)


if __name__ == "__main__":
    main()
