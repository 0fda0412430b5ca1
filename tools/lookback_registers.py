"""Registers and spills of ``lookback_scan`` configs for sm_90, without a GPU.

    python -m tools.lookback_registers [--stats] [CHUNKxBLOCK_MxWARPS[xSUB][c][l][r2][wN][pN] ...]

(default: the config space)

``--stats``: also the PTX's global loads/stores by width, branches and sin/cos ops
(``PTX_DUMP=DIR`` writes the PTX files there).

Specs of :func:`benchmarks.common.parse_lookback_config` (a trailing ``l``: loop-inner, e.g.
``64x512x4l``; then ``r2``: two rows per walk step, ``64x512x4lr2``, ``wN``: look-back width
N, ``32x256x4lw8``, and ``pN``: N software-pipeline stages, ``64x256x2lr2p4``).
``FUSED=1`` in the environment: the SAMU layer's fused kernels (loop configs).

Compiles the kernel (bf16 data, resets and h0 on) through Triton's NVIDIA backend to PTX and
runs the ptxas shipped with Triton on it (``ptxas -v``).  This is how the register budget in
``samu_tune/ops/scan/strategies/lookback_config.py`` was chosen.  Uses Triton's compiler internals
(``ASTSource``, backend stages): checked with Triton 3.6 and 3.9.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiled, not interpreted

import triton  # noqa: E402

from samu_tune.kernels import lookback as K  # noqa: E402
from samu_tune.launch_options import LAUNCH_OPTIONS  # noqa: E402
from samu_tune.ops.scan.strategies.lookback import LookbackPlan  # noqa: E402

from tools.compile_check import nvidia_bin, ptx_of, ptxas  # noqa: E402

INTS = ("B", "L", "M", "n_mtiles", "n_chunks", "window", "ticket0", "status0")


def ptx(reverse: bool, plan: LookbackPlan, dt: str = "bf16") -> str:
    fn = K.lookback_scan
    data = {"x_r_ptr", "x_i_ptr", "y_r_ptr", "y_i_ptr", "gx_r_ptr", "gx_i_ptr", "o_ptr", "xw_ptr"}
    loop = plan.loop
    # FUSED=1 in the environment: the SAMU layer fused (loop configs; forward saves h)
    flags = dict(HAS_RESETS=True, HAS_H0=True, REVERSE=reverse, DECOUPLED=True,
                 CHUNK=plan.chunk, BLOCK_M=plan.block_m, SUB=plan.sub, LOOP=loop,
                 M_ALIGN=int(os.environ.get("M_ALIGN", "8" if loop else "1")),
                 FUSED=bool(os.environ.get("FUSED")) and loop,
                 SAVE_H=bool(os.environ.get("FUSED")) and loop and not reverse, ROWS=plan.rows,
                 WIDTH=plan.width, REBASE=plan.rebase(reverse), STAGES=plan.stages,
                 # as the strategy launches it: the forward writes the loop walk's control
                 # table, the decoupled backward adds its gradient sums with atomics
                 HAS_END=True, ATOMIC=reverse and plan.atomic,
                 MAKE_TABLE=loop and not reverse)
    sig, const, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        name = p.name
        if name in flags or p.is_constexpr:    # a constexpr not named above: its default
            sig[name], const[name] = "constexpr", flags.get(name, p.default)
        elif name in INTS:
            sig[name] = "i32"
        else:
            sig[name] = (f"*{dt}" if name in data else "*i32" if name in ("sync_ptr", "seg_ptr")
                         else "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ptx_of(fn, sig, const, attrs, 90, num_warps=plan.num_warps, ptx_version=87,
                  **LAUNCH_OPTIONS)


def ptx_stats(text: str) -> str:
    """Global memory instructions by kind and width (``ld.global.v4.b32``: a 16-byte load),
    branches and MUFU ops in the PTX: whether row loads are vectorised."""
    kinds: dict = {}
    for m in re.finditer(r"\b((?:ld|st|cp\.async)[\w.]*global[\w.]*|bra(?:\.uni)?)\b", text):
        kinds[m.group(1)] = kinds.get(m.group(1), 0) + 1
    kinds["sin/cos.approx"] = len(re.findall(r"\b(?:sin|cos)\.approx", text))
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))


def registers(reverse: bool, plan: LookbackPlan, stats: bool = False) -> str:
    text = ptx(reverse, plan)
    if os.environ.get("PTX_DUMP"):
        out = Path(os.environ["PTX_DUMP"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{'bwd' if reverse else 'fwd'}_{plan.chunk}x{plan.block_m}x{plan.num_warps}"
               f"x{plan.sub}{'l' if plan.loop else ''}"
               f"{f'r{plan.rows}' if plan.rows > 1 else ''}w{plan.width}"
               f"{f'p{plan.stages}' if plan.stages > 1 else ''}.ptx").write_text(text)
    ok, regs = ptxas(text, 90)
    return (regs if ok else regs[-300:]) + ("\n    " + ptx_stats(text) if stats else "")


def main(argv=None) -> None:
    from samu_tune.ops.scan.strategies.lookback import LookbackConfig, valid
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", metavar="SPEC",
                    help="look-back config specs (default: the config space at (8, 8192, 1024))")
    ap.add_argument("--stats", action="store_true",
                    help="also the PTX's global loads/stores by width, branches, sin/cos ops")
    args = ap.parse_args(argv)
    stats = args.stats
    if args.configs:
        from benchmarks.common import parse_lookback_config
        configs = [parse_lookback_config(s) for s in args.configs]
    else:
        from samu_tune.ops.scan.problem import ScanProblem
        from samu_tune.registry import config_space
        big = ScanProblem(B=8, L=8192, M=1024)
        configs = [c for c in config_space(LookbackConfig) if valid(big, c)]
    # the kernel's constexprs, each once (look-back mode and window do not change registers;
    # the look-back width does)
    plans = sorted({dataclasses.replace(LookbackPlan.of(c), decoupled=True, window=1)
                    for c in configs}, key=dataclasses.astuple)
    print(f"triton {triton.__version__}, ptxas {nvidia_bin() / 'ptxas'}")
    for plan in plans:
        # elements per thread: of the tile, or of the row vector (loop)
        per_thread = (1 if plan.loop else plan.chunk) * plan.block_m // (32 * plan.num_warps)
        for reverse in (False, True):
            print(f"{'bwd' if reverse else 'fwd'} {'loop' if plan.loop else 'tile'} "
                  f"chunk={plan.chunk:3d} block_m={plan.block_m:4d} warps={plan.num_warps} "
                  f"sub={plan.sub:2d} rows={plan.rows} width={plan.width:2d} "
                  f"stages={plan.stages} ({per_thread:2d}/thread): "
                  f"{registers(reverse, plan, stats)}", flush=True)


if __name__ == "__main__":
    main()
