"""GPU timing of the fused SAMU layer at explicit look-back configs (the fused config policy).

    python -m benchmarks.bench_fused_configs [--out DIR] [--shapes 4x4096x512,1x16384x256]
        [--configs 64x512x4l,64x512x4lr2,...] [--rep-ms 40] [--warm N] [--device cuda|cpu]

For each layer shape (B, L, M) (x [B, L, 2M] bf16, fp32 parameters: bench_layer's layer
rows) and each loop-inner :class:`LookbackConfig` (specs as
:func:`benchmarks.common.parse_lookback_config`: ``64x512x4lr2`` = chunk 64, block_m 512,
4 warps, loop inner, 2 rows per step), the fused layer is called as ``samu_tune.ops.layer.fused.forward`` calls it,
``fused_autograd.fused_layer(x, dirs, scales, gamma, nu_log, theta_log, cfg)``, with ``cfg`` passed
straight in: no dispatch and no ``_fused_measured`` cap, so rows-2 configs at 4 lanes per thread
are timed too.  Two modes, GPU time (``common.time_call``, as bench_layer's ``_bench``):

- ``forward``: under no_grad, the parameter operands (dirs [2, 2M+1], scales [2], gamma [M])
  computed once outside the call (as the layer's ConstantsCache keeps them);
- ``train``: operands in torch, the fused layer, then ``autograd.grad`` of y [B, L, 2M] with a
  fixed bf16 upstream into x and all six parameters (bench_layer's train step).

Row ``auto``: the layer's own choice (``fused.config_for``: dispatch's scan pick through
``_loop_choice`` and the one-row cap), per mode; the row also records dispatch's raw scan pick
(before the cap).  Every other row is checked against auto's output (forward) and gradients
(train): max abs difference and relative norm error per tensor; a relative error over the
bf16 tolerance (``samu_tune.tolerances``, forward / gradient) flags the row, so a fast wrong
config is visible.  Auto itself is checked against ``SAMU(strategy="unfused")`` (the scan
through ``samu_tune.scan``, controller and write in torch), unless ``--no-anchor``.
Configs ``valid()`` rejects for the scan problem, or that fail, are skipped with the reason.

Compilation: ``--warm N`` (CUDA, default 6) first runs every (shape, config) once in N spawned
processes (Triton's disk cache is shared), so the timed process loads binaries instead of
compiling them one by one.  Writes DIR/fused_configs.json and DIR/fused_configs.md after every
row (a run stopped at its time limit keeps what it measured).

CPU smoke test (operands, the call path, checks, the writers; seconds)::

    TRITON_INTERPRET=1 python -m benchmarks.bench_fused_configs --device cpu \\
        --shapes 1,32,128 --configs 32x128x2lr2,64x32x4 --rep-ms 1 --out /tmp/fused_smoke

(loop configs need M > 64: 32 lanes x 2 warps x 2 lanes per thread at least.)
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path
from typing import Optional

import torch

import samu_tune
from samu_tune import dispatch
from samu_tune.ops.layer import fused, fused_autograd
from samu_tune.settings import settings
from samu_tune.ops.scan.strategies import lookback
from samu_tune.ops.scan.strategies.lookback import LookbackConfig
from samu_tune.tolerances import TOLERANCES, relative_error

from benchmarks.common import (LAYER_SHAPES, add_out, error_text, lookback_spec,
                               parse_lookback_config, parse_shapes, spawn_pool, time_call,
                               write_json)

CONFIGS = ["64x512x4l", "64x512x4lr2", "64x512x8lr2", "64x256x4lr2", "64x256x2l",
           "64x256x2lr2", "32x256x4lr2", "32x256x2l", "64x128x2lr2", "32x512x4lr2"]
DTYPE = torch.bfloat16
TOL = TOLERANCES["bfloat16"]      # relative norm error: forward (y), gradient (every leaf)


class Case:
    """One layer shape's operands on ``device``: x [B, L, 2M] bf16 (and a leaf copy for the
    train step), a ``samu_tune.SAMU(M)`` layer's fp32 parameters, the no-grad parameter
    operands, and a fixed bf16 upstream gradient [B, L, 2M]."""

    def __init__(self, shape, device):
        B, L, M = shape
        self.shape, self.device = tuple(shape), torch.device(device)
        torch.manual_seed(0)
        self.layer = samu_tune.SAMU(M, device=device)
        self.params = self.layer.params()
        self.x = torch.randn(B, L, 2 * M, device=device, dtype=DTYPE)
        self.g = torch.randn(B, L, 2 * M, device=device, dtype=DTYPE)
        self.xg = self.x.detach().requires_grad_(True)
        names, leaves = zip(*self.layer.named_parameters())
        self.leaf_names, self.leaves = ("x", *names), (self.xg, *leaves)
        self.consts = fused.operands_no_grad(self.params)

    def problem(self, backward: bool):
        """The scan problem inside the layer call (what ``valid`` and dispatch see)."""
        return fused.scan_problem(self.x, None, False, backward)

    def auto(self, backward: bool) -> Optional[LookbackConfig]:
        """The fused layer's own config for this call (``config_for``: dispatch + cap)."""
        return fused.config_for(self.x, None, False, "auto", backward)

    def scan_pick(self, backward: bool) -> str:
        """Dispatch's scan decision for the layer's scan problem, before ``_fused_measured``."""
        d = dispatch.choose(self.problem(backward), "auto", device=self.device, allow_tune=False)
        cfg = d.config
        name = (lookback_spec(cfg) if isinstance(cfg, LookbackConfig)
                else json.dumps(cfg.model_dump()))
        return f"{d.strategy.name} {name} ({d.source})"

    def _fused(self, x, operands, cfg):
        # fused.forward's call without state or resets (x, nu_log, theta_log contiguous)
        dirs, scales, gamma = operands
        p = self.params
        return fused_autograd.fused_layer(x, dirs, scales, gamma, p.nu_log.contiguous(),
                                    p.theta_log.contiguous(), cfg)[0]

    def forward(self, cfg):
        """y [B, L, 2M] under no_grad, cached operands (the layer's inference call)."""
        def call():
            with torch.no_grad():
                return self._fused(self.x, self.consts, cfg)
        return call

    def train(self, cfg):
        """Gradients of (x, every parameter) through the fused layer (bench_layer's step)."""
        def call():
            y = self._fused(self.xg, fused.operands(self.params), cfg)
            return torch.autograd.grad(y, self.leaves, self.g, allow_unused=True)
        return call

    def unfused(self):
        """(y, grads) of ``SAMU(strategy="unfused")`` with the same parameters and inputs."""
        layer = copy.deepcopy(self.layer)
        layer.strategy = "unfused"
        with torch.no_grad():
            y = layer(self.x)[0]
        xg = self.x.detach().requires_grad_(True)
        grads = torch.autograd.grad(layer(xg)[0], (xg, *layer.parameters()), self.g,
                                    allow_unused=True)
        return y, grads

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def compare(case: Case, y, grads, ref_y, ref_grads) -> dict:
    """Max abs difference and relative norm error of y and every gradient against a reference;
    ``flags``: the tensors over the bf16 tolerance (forward for y, gradient for the leaves)."""
    out = {"y": _diff(y, ref_y)} if y is not None else {}
    for name, got, want in zip(case.leaf_names, grads or (), ref_grads or ()):
        out[f"grad_{name}"] = _diff(got, want)
    flags = [f"{k} rel {v['rel']:.3g}" for k, v in out.items()
             if not v["rel"] <= (TOL.forward if k == "y" else TOL.gradient)]
    return {"diffs": out, "flags": flags}


def _diff(got, want) -> dict:
    if got is None or want is None:
        return {"max_abs": math.inf if (got is None) != (want is None) else 0.0,
                "rel": math.inf if (got is None) != (want is None) else 0.0}
    return {"max_abs": float((got.double() - want.double()).abs().max()),
            "rel": relative_error(got, want)}


def skip_reason(case: Case, cfg: LookbackConfig) -> Optional[str]:
    if cfg.inner != "loop":
        return "not loop-inner (the fused layer runs loop configs only)"
    bad = [m for m, bw in (("forward", False), ("train", True))
           if not lookback.valid(case.problem(bw), cfg)]
    return f"valid() rejects it ({', '.join(bad)})" if bad else None


def measure(case: Case, label: str, cfg_fwd, cfg_train, rep_ms: float, ref=None) -> tuple:
    """One row: first-call seconds, forward / train GPU ms, diffs against ``ref`` (y, grads).
    Returns (row, (y, grads)); on a failure the row carries ``error`` and the pair is None."""
    row = {"shape": list(case.shape), "label": label, "config": lookback_spec(cfg_fwd),
           "config_train": lookback_spec(cfg_train)}
    try:
        t0 = time.perf_counter()
        y, grads = case.forward(cfg_fwd)(), case.train(cfg_train)()
        case.sync()
        row["first_s"] = time.perf_counter() - t0
        row["leaves_without_grad"] = sum(g is None for g in grads)
        if ref is not None:
            row.update(compare(case, y, grads, *ref))
        row["forward_ms"] = time_call(case.forward(cfg_fwd), rep_ms, device=case.device)["ms"]
        row["train_ms"] = time_call(case.train(cfg_train), rep_ms, device=case.device)["ms"]
        B, L, _ = case.shape
        row["tokens_per_s_train"] = B * L / (row["train_ms"] * 1e-3)
        return row, (y, grads)
    except Exception as exc:  # recorded, the others go on
        row["error"] = error_text(exc)
        return row, None


# ---------------------------------------------------------------- warm-up pool ----------------

def _warm(task):
    """Compile (shape, config) in a spawned process: one forward and one train step."""
    shape, cfg, device = task
    cfg = LookbackConfig(**cfg)
    t0 = time.perf_counter()
    try:
        case = Case(shape, device)
        case.forward(cfg)()
        case.train(cfg)()
        case.sync()
        return task, time.perf_counter() - t0, None
    except Exception as exc:
        return task, time.perf_counter() - t0, error_text(exc, 300)


def warm_all(tasks, workers: int) -> None:
    t0 = time.perf_counter()
    with spawn_pool(workers) as pool:
        for (shape, cfg, _), secs, err in pool.map(_warm, tasks):
            if err:
                print(f"  warm {shape} {lookback_spec(LookbackConfig(**cfg))}: {secs:.1f}s "
                      f"ERROR {err}", flush=True)
    print(f"warmed {len(tasks)} (shape, config) pairs in {workers} processes: "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


# ---------------------------------------------------------------- output ----------------------

def _ms(v):
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def _worst(row, prefix) -> str:
    vals = [v["rel"] for k, v in row.get("diffs", {}).items() if k.startswith(prefix)]
    return f"{max(vals):.2g}" if vals else "-"


def markdown(result: dict) -> str:
    clock = ("GPU ms (common.time_call)" if result["device"] != "cpu"
             else "wall ms under the Triton interpreter (a smoke test, not a timing)")
    lines = [f"# Fused SAMU layer by look-back config ({result['device']})", "",
             f"{clock}; x bf16, fp32 parameters; `vs auto` = auto's train "
             "ms / this row's (> 1: faster than the layer's own choice); errors: relative norm "
             f"against auto (y; worst gradient leaf), flagged over {TOL.forward:g} / "
             f"{TOL.gradient:g}."]
    for shape in result["shapes"]:
        rows = [r for r in result["rows"] if r["shape"] == list(shape)]
        auto = next((r for r in rows if r["label"] == "auto"), {})
        lines += ["", f"## B, L, M = {tuple(shape)}", ""]
        if auto:
            lines.append(f"auto: forward {auto['config']}, train {auto['config_train']}; "
                         f"dispatch's scan pick: forward {auto.get('scan_pick_forward')}, "
                         f"train {auto.get('scan_pick_train')}; vs unfused: "
                         f"{auto.get('anchor', 'not checked')}")
            lines.append("")
        lines += ["| config | fwd ms | train ms | vs auto | err y | err grad | first s | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            name = r["label"] if r["label"] != "auto" else f"auto ({r['config_train']})"
            ratio = (auto.get("train_ms", math.nan) / r["train_ms"]) if "train_ms" in r else None
            note = r.get("skipped") or r.get("error") or "; ".join(r.get("flags", [])) or ""
            lines.append(f"| {name} | {_ms(r.get('forward_ms'))} | {_ms(r.get('train_ms'))} | "
                         f"{'-' if ratio is None else f'{ratio:.2f}'} | {_worst(r, 'y')} | "
                         f"{_worst(r, 'grad_')} | {_ms(r.get('first_s'))} | {note} |")
    return "\n".join(lines) + "\n"


def save(out: Path, result: dict) -> None:
    write_json(out / "fused_configs.json", result)
    (out / "fused_configs.md").write_text(markdown(result))


def summary(result: dict) -> None:
    for shape in result["shapes"]:
        rows = [r for r in result["rows"] if r["shape"] == list(shape) and "train_ms" in r]
        auto = next((r for r in rows if r["label"] == "auto"), None)
        ok = [r for r in rows if not r.get("flags")]
        print(f"\n== {tuple(shape)}")
        if auto:
            print(f"  auto        fwd {auto['forward_ms']:.3f} ms ({auto['config']})  "
                  f"train {auto['train_ms']:.3f} ms ({auto['config_train']})")
        for mode in ("forward", "train"):
            if ok:
                best = min(ok, key=lambda r: r[f"{mode}_ms"])
                rel = f" = {auto[f'{mode}_ms'] / best[f'{mode}_ms']:.2f}x auto" if auto else ""
                print(f"  best {mode:7s} {best[f'{mode}_ms']:.3f} ms: {best['label']}{rel}")
        for r in rows:
            if r.get("flags"):
                print(f"  FLAGGED {r['label']}: {'; '.join(r['flags'])}")


# ---------------------------------------------------------------- main ------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out(ap)
    ap.add_argument("--shapes", type=parse_shapes, default=LAYER_SHAPES,
                    help="layer shapes B,L,M[;B,L,M] or BxLxM,... (default %(default)s)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma list of look-back config specs (common.parse_lookback_config)")
    ap.add_argument("--rep-ms", type=float, default=40.0, help="target ms of samples per timing")
    ap.add_argument("--warm", type=int, default=6,
                    help="compile every (shape, config) in this many processes first (CUDA; 0: no)")
    ap.add_argument("--no-anchor", action="store_true",
                    help="skip checking auto against SAMU(strategy='unfused')")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke test under TRITON_INTERPRET=1 (tiny shapes only)")
    args = ap.parse_args(argv)
    if args.device == "cpu" and not settings().interpret:
        ap.error("--device cpu runs the Triton kernels under the interpreter: set "
                 "TRITON_INTERPRET=1")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device (use --device cpu with TRITON_INTERPRET=1 for a smoke test)")
    labels = [s for s in args.configs.split(",") if s]
    chosen = [(s, parse_lookback_config(s)) for s in labels]
    result = {"device": (torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"),
              "torch": torch.__version__, "shapes": [list(s) for s in args.shapes],
              "rep_ms": args.rep_ms, "tolerance": TOL._asdict(), "rows": []}
    t_start = time.perf_counter()

    cases = {shape: Case(shape, args.device) for shape in args.shapes}
    autos = {shape: (c.auto(False), c.auto(True)) for shape, c in cases.items()}
    if args.device == "cuda" and args.warm > 0:
        tasks = []
        for shape, case in cases.items():
            todo = {cfg for _, cfg in chosen if skip_reason(case, cfg) is None}
            todo |= {cfg for cfg in autos[shape] if cfg is not None}
            tasks += [(shape, cfg.model_dump(), args.device) for cfg in todo]
        try:
            warm_all(tasks, args.warm)
        except Exception as exc:  # e.g. a worker died: the timed loop compiles what is left
            print(f"warm-up failed ({error_text(exc)}); compiling in the timed loop",
                  flush=True)

    for shape, case in cases.items():
        B, L, M = shape
        print(f"\n== B={B} L={L} M={M} bf16", flush=True)
        auto_fwd, auto_train = autos[shape]
        if auto_fwd is None or auto_train is None:
            row, ref = {"shape": list(shape), "label": "auto",
                        "skipped": "the fused layer has no config here"}, None
        else:
            row, ref = measure(case, "auto", auto_fwd, auto_train, args.rep_ms)
            for mode, bw in (("forward", False), ("train", True)):
                try:
                    row[f"scan_pick_{mode}"] = case.scan_pick(bw)
                except Exception as exc:
                    row[f"scan_pick_{mode}"] = error_text(exc, 200)
            if ref is not None and not args.no_anchor:
                try:
                    anchor = compare(case, ref[0], ref[1], *case.unfused())
                    row["anchor_diffs"] = anchor["diffs"]
                    row["anchor"] = "; ".join(anchor["flags"]) or (
                        f"ok (y rel {anchor['diffs']['y']['rel']:.2g}, worst grad rel "
                        f"{max(v['rel'] for k, v in anchor['diffs'].items() if k != 'y'):.2g})")
                except Exception as exc:
                    row["anchor"] = "failed: " + error_text(exc, 292)
        _print(row)
        result["rows"].append(row)
        save(args.out, result)
        for label, cfg in chosen:
            why = skip_reason(case, cfg)
            if why is not None:
                row = {"shape": list(shape), "label": label, "config": lookback_spec(cfg),
                       "skipped": why}
            else:
                row, _ = measure(case, label, cfg, cfg, args.rep_ms, ref)
            _print(row)
            result["rows"].append(row)
            save(args.out, result)
    result["wall_s"] = time.perf_counter() - t_start
    save(args.out, result)
    summary(result)
    print(f"\nwall {result['wall_s']:.1f} s; wrote {args.out}/fused_configs.json and .md")


def _print(row: dict) -> None:
    label = row["label"] + (f" ({row['config']}/{row['config_train']})"
                            if row["label"] == "auto" and "config" in row else "")
    if "train_ms" in row:
        extra = row.get("anchor", "")
        print(f"  {label:36s} fwd {row['forward_ms']:.3f} ms  train {row['train_ms']:.3f} ms  "
              f"first {row['first_s']:.1f} s  {'; '.join(row.get('flags', [])) or 'ok'}"
              + (f"  vs unfused: {extra}" if extra else ""), flush=True)
    else:
        print(f"  {label:36s} {row.get('skipped') or row.get('error')}", flush=True)


if __name__ == "__main__":
    main()
