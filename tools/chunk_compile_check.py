"""Compile the chunk family's kernels for a CUDA target without a GPU and report, per binary,
compile time, registers and spill (stack) bytes.

Uses the ptxas shipped in the triton wheel, so it runs on a CPU-only machine::

    python -m tools.chunk_compile_check --B 8 --L 8192 --M 1024 [--arch 90] [--limit N]

Every distinct binary that the valid configs of ``chunk``, ``hierarchical`` and ``grouped`` at
that problem (training, resets, h0, final state, bf16) would build is compiled once; the
summary lists the slowest compiles and any binary that spills.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compiled, not interpreted

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from samu_tune import registry  # noqa: E402
from samu_tune.kernels import chunk as chunk_kernels, prefix as prefix_kernels  # noqa: E402
from samu_tune.ops.scan.problem import ScanProblem  # noqa: E402
from samu_tune.ops.scan.strategies import chunk_family as common  # noqa: E402

from tools.compile_check import nvidia_bin  # noqa: E402

_REV_ONLY = ("h_r_ptr", "h_i_ptr", "h0_r_ptr", "h0_i_ptr", "gh0_r_ptr", "gh0_i_ptr", "g_eta_ptr",
             "g_delta_ptr", "g_nu_ptr", "g_theta_ptr")
_BF16 = ("x_r_ptr", "x_i_ptr", "y_r_ptr", "y_i_ptr", "h_r_ptr", "h_i_ptr")


def _binaries(plan: common.ChunkPlan):
    """(kernel, constexprs, num_warps, num_stages) of every launch of one plan, forward and
    backward."""
    out = []
    for rev in (False, True):
        tile = dict(HAS_RESETS=True, REVERSE=rev, WALK=plan.walk, CHUNK=plan.chunk,
                    BLOCK_M=plan.block_m, NUM_STAGES=plan.num_stages)
        out.append((chunk_kernels.chunk_summary, tile, plan.num_warps, plan.num_stages))
        replay = dict(tile, HAS_H0=True, ATOMIC=plan.atomic and rev)
        if not rev:
            replay.update({n: None for n in _REV_ONLY})
        out.append((chunk_kernels.chunk_replay, replay, plan.num_warps, plan.num_stages))
    flags = dict(HAS_INIT=True, WRITE_END=True, BLOCK_M=plan.block_m)
    serial_warps = common._prefix_warps(1, plan.block_m)
    if plan.prefix == "serial":
        out.append((prefix_kernels.prefix_serial, flags, serial_warps, None))
    elif plan.prefix == "hierarchical":
        out.append((prefix_kernels.prefix_blocked, dict(flags, BLOCK_C=plan.prefix_block),
                    common._prefix_warps(plan.prefix_block, plan.block_m), None))
    else:
        warps = common._prefix_warps(plan.prefix_block, plan.block_m)
        out.append((prefix_kernels.prefix_serial, flags, serial_warps, None))
        for expand in (False, True):
            out.append((prefix_kernels.group_scan,
                        dict(EXPAND=expand, GROUP=plan.prefix_block, BLOCK_M=plan.block_m),
                        warps, None))
    return out


def _compile(fn, consts, num_warps, num_stages, target):
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name == "seg_ptr":
            sig[name] = "*i32"
        elif name in _BF16:
            sig[name] = "*bf16"
        else:
            sig[name] = "*fp32" if name.endswith("ptr") else "i32"
    start = time.perf_counter()
    kernel = triton.compile(ASTSource(fn, sig, constexprs=consts), target=target,
                            options=dict(num_warps=num_warps, **(
                                {} if num_stages is None else dict(num_stages=num_stages))))
    seconds = time.perf_counter() - start
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(kernel.asm["cubin"])
        fh.flush()
        usage = subprocess.run([str(nvidia_bin() / "cuobjdump"), "-res-usage", fh.name],
                               capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", usage)
    regs, stack = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    return seconds, regs, stack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--M", type=int, default=1024)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--limit", type=int, default=0, help="compile at most this many binaries")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="chunk_compile_check_"))
    problem = ScanProblem(B=args.B, L=args.L, M=args.M, resets=True, initial_state=True,
                          final_state=True)
    seen, jobs = set(), []
    for name in common.MEMBERS:
        for cfg in registry.get(name).configs(problem):
            plan = common.plan_for(name, cfg)
            for fn, consts, warps, stages in _binaries(plan):
                key = (fn.__name__, tuple(sorted(consts.items())), warps, stages)
                if key not in seen:
                    seen.add(key)
                    jobs.append((fn, consts, warps, stages))
    if args.limit:
        jobs = jobs[:args.limit]
    target = GPUTarget("cuda", args.arch, 32)
    results = []
    for i, (fn, consts, warps, stages) in enumerate(jobs):
        seconds, regs, stack = _compile(fn, consts, warps, stages, target)
        label = f"{fn.__name__} warps={warps} " + " ".join(
            f"{k}={v}" for k, v in consts.items() if v is not None and not k.endswith("ptr"))
        results.append((seconds, regs, stack, label))
        print(f"[{i + 1}/{len(jobs)}] {seconds:5.1f}s regs={regs:3d} stack={stack:4d}  {label}",
              flush=True)
    results.sort(reverse=True)
    print(f"\n{len(results)} binaries for {problem.key()} on sm_{args.arch}; "
          f"total {sum(r[0] for r in results):.0f}s, slowest:")
    for r in results[:5]:
        print(f"  {r[0]:5.1f}s  {r[3]}")
    spills = [r for r in results if r[2] > 0]
    print(f"{len(spills)} binaries use stack (register spills, or ~32 bytes for pipelined loops):")
    for r in sorted(spills, key=lambda r: -r[2])[:10]:
        print(f"  stack={r[2]} regs={r[1]}  {r[3]}")


if __name__ == "__main__":
    main()
