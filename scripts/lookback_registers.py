"""Registers and spills of ``lookback_scan`` configs for sm_90, without a GPU.

    python scripts/lookback_registers.py [--stats] [CHUNKxBLOCK_MxWARPS[xSUB][c][l][r2][wN] ...]   (default: the config space)

``--stats``: also the PTX's global loads/stores by width, branches and sin/cos ops
(``PTX_DUMP=DIR`` writes the PTX files there).

Specs as in ``scripts/bench_lookback.py`` (a trailing ``l``: loop-inner, e.g. ``64x512x4l``;
then ``r2``: two rows per walk step, ``64x512x4lr2``, and ``wN``: look-back width N,
``32x256x4lw8``).

Compiles the kernel (bf16 data, resets and h0 on) through Triton's NVIDIA backend to PTX and
runs the ptxas shipped with Triton on it (``ptxas -v``).  This is how the register budget in
``samu_tune/strategies/lookback.py`` was chosen.  Uses Triton's compiler internals
(``ASTSource``, backend stages): checked with Triton 3.6 and 3.9.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402

from compile_check import ptx_of  # noqa: E402
from samu_tune.kernels import lookback as K  # noqa: E402
from samu_tune.strategies.lookback import LookbackPlan  # noqa: E402

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
INTS = ("B", "L", "M", "n_mtiles", "n_chunks", "window")


def ptx(reverse: bool, chunk: int, block_m: int, num_warps: int, sub: int = 1,
        loop: bool = False, dt: str = "bf16", rows: int = 1, width: int = 1,
        stages: int = 1) -> str:
    fn = K.lookback_scan
    data = {"x_r_ptr", "x_i_ptr", "y_r_ptr", "y_i_ptr", "gx_r_ptr", "gx_i_ptr", "o_ptr", "xw_ptr"}
    # FUSED=1 in the environment: the SAMU layer fused (loop configs; forward saves h)
    flags = dict(HAS_RESETS=True, HAS_H0=True, REVERSE=reverse, DECOUPLED=True, CHUNK=chunk,
                 BLOCK_M=block_m, SUB=sub, LOOP=loop,
                 M_ALIGN=int(os.environ.get("M_ALIGN", "8" if loop else "1")),
                 FUSED=bool(os.environ.get("FUSED")) and loop,
                 SAVE_H=bool(os.environ.get("FUSED")) and loop and not reverse, ROWS=rows,
                 WIDTH=width, REBASE=LookbackPlan(chunk, block_m, num_warps, True, 1, sub, loop,
                                                  rows, width, stages).rebase(reverse),
                 STAGES=stages)
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in flags:
            sig[name], const[name] = "constexpr", flags[name]
        elif name in INTS:
            sig[name] = "i32"
        else:
            sig[name] = (f"*{dt}" if name in data else "*i32" if name in ("sync_ptr", "seg_ptr")
                         else "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ptx_of(fn, sig, const, attrs, 90, num_warps=num_warps, ptx_version=87)


def ptx_stats(text: str) -> str:
    """Global memory instructions by kind and width (``ld.global.v4.b32``: a 16-byte load),
    branches and MUFU ops in the PTX: whether row loads are vectorised."""
    kinds: dict = {}
    for m in re.finditer(r"\b((?:ld|st|cp\.async)[\w.]*global[\w.]*|bra(?:\.uni)?)\b", text):
        kinds[m.group(1)] = kinds.get(m.group(1), 0) + 1
    kinds["sin/cos.approx"] = len(re.findall(r"\b(?:sin|cos)\.approx", text))
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))


def registers(reverse: bool, chunk: int, block_m: int, num_warps: int, sub: int = 1,
              loop: bool = False, stats: bool = False, rows: int = 1, width: int = 1,
              stages: int = 1) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        text = ptx(reverse, chunk, block_m, num_warps, sub, loop, rows=rows, width=width,
                   stages=stages)
        if os.environ.get("PTX_DUMP"):
            out = Path(os.environ["PTX_DUMP"])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{'bwd' if reverse else 'fwd'}_{chunk}x{block_m}x{num_warps}x{sub}"
                   f"{'l' if loop else ''}{f'r{rows}' if rows > 1 else ''}w{width}"
                   f"{f'p{stages}' if stages > 1 else ''}.ptx").write_text(text)
        path.write_text(text)
        res = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(path), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    lines = [ln.split("ptxas info    : ")[-1].strip() for ln in res.stderr.splitlines()
             if "registers" in ln or "spill" in ln]
    regs = " | ".join(lines) if res.returncode == 0 else res.stderr.strip()[-300:]
    return regs + ("\n    " + ptx_stats(text) if stats else "")


def main() -> None:
    from samu_tune.strategies.lookback import LookbackConfig, LookbackPlan, valid
    args = [a for a in sys.argv[1:] if a != "--stats"]
    stats = "--stats" in sys.argv[1:]
    if args:
        from bench_lookback import parse_config
        configs = [parse_config(s) for s in args]
    else:
        from samu_tune.problem import ScanProblem
        from samu_tune.registry import config_space
        big = ScanProblem(B=8, L=8192, M=1024)
        configs = [c for c in config_space(LookbackConfig) if valid(big, c)]
    # the kernel's constexprs, each once (look-back mode and window do not change registers;
    # the look-back width does)
    plans = sorted({(p.loop, p.chunk, p.block_m, p.num_warps, p.sub, p.rows, p.width, p.stages)
                    for p in map(LookbackPlan.of, configs)})
    print(f"triton {triton.__version__}, ptxas {PTXAS}")
    for loop, chunk, block_m, warps, sub, rows, width, stages in plans:
        # elements per thread: of the tile, or of the row vector (loop)
        per_thread = (1 if loop else chunk) * block_m // (32 * warps)
        for reverse in (False, True):
            regs = registers(reverse, chunk, block_m, warps, sub, loop, stats, rows, width,
                             stages)
            print(f"{'bwd' if reverse else 'fwd'} {'loop' if loop else 'tile'} chunk={chunk:3d} "
                  f"block_m={block_m:4d} warps={warps} sub={sub:2d} rows={rows} width={width:2d} "
                  f"stages={stages} ({per_thread:2d}/thread): {regs}", flush=True)


if __name__ == "__main__":
    main()
