"""GPU benchmark of the SAMU layer and the decode step, one run on the device.

Layer (x [B, L, 2M] bf16, fp32 parameters): forward and forward+backward (gradients of x and
every parameter) of
  - ``samu_tune.SAMU`` with its default ``strategy="auto"``, and forced ``"unfused"``
    (controller and write in torch, the tuned ``samu_tune.scan``, ReLU) and ``"fused"``,
  - the same layer with the seed's default scan dispatch in place of ``samu_tune.scan``
    (the seed's own fused-write path needs its private controller cache; not timed here).
Decode (one token, x [B, 2M] bf16, M = 512): tokens/s at B = 1, 8, 64 of ``SAMU.step``
(auto, single, blocked; fresh outputs and in place) and the seed's ``samu_decode`` /
``samu_decode_blocked``, each checked against the float64 step reference first, timed as a
back-to-back loop (host + device: what generation pays) and as a CUDA-graph replay (device
only).  See :func:`decode_rows`.
Writes ``layer.json`` under --out (``--layer-only``: ``layer_only.json``, the layer rows only;
``--decode-only``: the decode rows only).

    python -m benchmarks.bench_layer --out DIR [--layer-only | --decode-only]
"""
from __future__ import annotations

import argparse
import copy
import math
import time

import torch

import samu_tune
from samu_tune.ops.layer import controller
from samu_tune.ops.layer.reference import step_reference

from benchmarks.common import (LAYER_SHAPES, add_out, error_text, per_call_us, seed_module,
                               time_call, write_json)

DECODE_BATCHES = [1, 8, 64]
DECODE_M = 512


def _bench(fn, rep_ms):
    """GPU time (ms) with the tuner's clock (host launch time excluded; common.time_call)."""
    fn()
    return time_call(fn, rep_ms)["ms"]


def layer_rows(rep_ms):
    seed = seed_module()
    rows = []
    for B, L, M in LAYER_SHAPES:
        torch.manual_seed(0)
        layer = samu_tune.SAMU(M, device="cuda")
        x = torch.randn(B, L, 2 * M, device="cuda", dtype=torch.bfloat16)
        modules = {}
        for strategy in ("unfused", "fused"):
            modules[strategy] = samu_tune.SAMU(M, device="cuda", strategy=strategy)
            modules[strategy].load_state_dict(layer.state_dict())

        def seed_layer(inp):
            p = layer.params()
            eta, delta = controller.controls(inp, p)
            br, bi = controller.writes(inp, p)
            hr, hi = seed.samu_training_scan_dispatch(eta, delta, layer.nu_log, layer.theta_log,
                                                      br, bi)[:2]
            return torch.relu(torch.cat([hr, hi], dim=-1))

        def unfused(inp):
            return modules["unfused"](inp)[0]

        # each variant with the module whose parameters its training step differentiates
        variants = [("samu_tune.SAMU (default strategy: auto)", lambda inp: layer(inp)[0], layer),
                    ("samu_tune.SAMU (strategy: unfused)", unfused, modules["unfused"]),
                    ("samu_tune.SAMU (strategy: fused)", lambda inp: modules["fused"](inp)[0],
                     modules["fused"])]
        if seed is not None:
            variants.append(("our controller + seed default scan", seed_layer, layer))
        for name, fn, module in variants:
            row = {"name": name, "shape": [B, L, M]}
            try:
                t0 = time.perf_counter()
                with torch.no_grad():
                    fn(x)
                torch.cuda.synchronize()
                row["first_s"] = time.perf_counter() - t0
                with torch.no_grad():
                    row["max_abs_diff_vs_unfused"] = float(
                        (fn(x).float() - unfused(x).float()).abs().max())
                with torch.no_grad():
                    row["forward_ms"] = _bench(lambda: fn(x), rep_ms)
                xg = x.detach().requires_grad_(True)
                leaves = [xg, *module.parameters()]
                g = torch.randn(B, L, 2 * M, device="cuda", dtype=torch.bfloat16)

                def train():
                    return torch.autograd.grad(fn(xg), leaves, g, allow_unused=True)
                # 0 for every variant: each differentiates x and all of its module's parameters
                row["leaves_without_grad"] = sum(gr is None for gr in train())
                row["train_ms"] = _bench(train, rep_ms)
                row["tokens_per_s_train"] = B * L / (row["train_ms"] * 1e-3)
            except Exception as exc:
                row["error"] = error_text(exc, 400)
            print(f"layer {name:40s} {B, L, M}: fwd {row.get('forward_ms', float('nan')):.3f} ms"
                  f" train {row.get('train_ms', float('nan')):.3f} ms {row.get('error', '')}",
                  flush=True)
            rows.append(row)
    return rows


def _step_loop_us(fn, steps, repeats=5):
    """Wall time per call of ``steps`` back-to-back calls, one sync at the end (best of 5).

    What a generation loop pays per token: host path and kernel, whichever is longer.
    """
    return per_call_us(fn, steps, repeats, warmup=20, sync=torch.cuda.synchronize)


def _graph_us(fn, steps, repeats=5):
    """Per step of one CUDA graph holding ``fn`` once, replayed ``steps`` times: the device
    side of a step with the host path taken out (fn's allocations come from the graph pool)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _step_loop_us(graph.replay, steps, repeats)


def decode_rows(steps):
    """Tokens/s of one decode step, x [B, 2M] bf16, fp32 state, M = DECODE_M.

    Ours through ``SAMU.step`` (the generation API: cached digested parameters and launch
    plan), with fresh outputs and with ``out=``/``state_out=state`` (in place, no
    allocation); the seed's ``samu_decode`` and ``samu_decode_blocked`` (its blocked inputs
    prepared once, outside the loop).  Each variant is checked against the float64 step
    reference first, then timed as a loop (``step_us``, the tokens/s basis) and as a
    CUDA-graph replay (``graph_us``: the kernel-bound floor).
    """
    seed = seed_module()
    rows = []
    M = DECODE_M
    torch.manual_seed(0)
    base = samu_tune.SAMU(M, device="cuda")
    layers = {}
    for name in ("auto", "single", "blocked"):
        layers[name] = copy.deepcopy(base)
        layers[name].decode_strategy = name
    p = base.params()
    for B in DECODE_BATCHES:
        x = torch.randn(B, 2 * M, device="cuda", dtype=torch.bfloat16)
        state = tuple(torch.randn(B, M, device="cuda") * 0.5 for _ in range(2))
        with torch.no_grad():
            want_y, want_s = step_reference(x.double(), p.to(torch.float64),
                                            tuple(s.double() for s in state),
                                            dtype=torch.float64)
        out = torch.empty_like(x)
        work = tuple(s.clone() for s in state)  # the in-place variants' state

        def in_place(layer):
            return lambda: layer.step(x, work, out=out, state_out=work)

        variants = []
        for name, layer in layers.items():
            variants.append((f"ours step {name}", lambda layer=layer: layer.step(x, state)))
            variants.append((f"ours step {name} in-place", in_place(layer)))
        if seed is not None:
            with torch.no_grad():
                gamma = torch.sqrt(torch.clamp(1 - torch.exp(-2 * p.nu_log.exp()), min=0)) + 1e-8
                unit = [d / d.norm() for d in (p.phase_direction, p.radial_direction)]
                scales = [torch.tanh(a).reshape(1) / math.sqrt(M)
                          for a in (p.phase_amplitude, p.radial_amplitude)]
                theta = p.theta_log.exp()
                blocked_args = (*unit, *scales, p.nu_log.exp(), theta.cos(), theta.sin(), gamma)
            raw = [t.detach() for t in p]
            variants += [
                ("seed samu_decode", lambda: seed.samu_decode(x, *raw, *state)),
                ("seed samu_decode_blocked",
                 lambda: seed.samu_decode_blocked(x, *blocked_args, *state)),
            ]
        for name, fn in variants:
            row = {"name": name, "B": B, "M": M}
            try:
                with torch.no_grad():
                    for w, s in zip(work, state):
                        w.copy_(s)  # the in-place variants start from the same state
                    y, s = fn()
                    err = max((y.double() - want_y).abs().max().item(),
                              (s[0].double() - want_s[0]).abs().max().item(),
                              (s[1].double() - want_s[1]).abs().max().item())
                    row["max_abs_err"] = err
                    row["step_us"] = _step_loop_us(fn, steps)
                    row["tokens_per_s"] = B / (row["step_us"] * 1e-6)
                    row["graph_us"] = _graph_us(fn, steps)
                    row["tokens_per_s_graph"] = B / (row["graph_us"] * 1e-6)
            except Exception as exc:
                row["error"] = error_text(exc, 400)
            print(f"decode {name:30s} B={B:3d} M={M}: {row.get('step_us', float('nan')):7.2f} us"
                  f" {row.get('tokens_per_s', float('nan')):.3g} tok/s | graph"
                  f" {row.get('graph_us', float('nan')):6.2f} us"
                  f" {row.get('tokens_per_s_graph', float('nan')):.3g} tok/s"
                  f" | err {row.get('max_abs_err', float('nan')):.2e} {row.get('error', '')}",
                  flush=True)
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    add_out(ap)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--decode-steps", type=int, default=500,
                    help="steps per timed decode loop (best of 5 loops)")
    ap.add_argument("--decode-only", action="store_true", help="skip the layer benchmark")
    ap.add_argument("--layer-only", action="store_true", help="skip the decode benchmark")
    args = ap.parse_args(argv)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "decode": [] if args.layer_only else decode_rows(args.decode_steps),
              "layer": [] if args.decode_only else layer_rows(args.rep_ms)}
    name = "layer_only.json" if args.layer_only else "layer.json"
    write_json(args.out / name, result)


if __name__ == "__main__":
    main()
