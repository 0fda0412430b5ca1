"""Compile every kernel launch the library makes, with its real arguments, for a CUDA target
without a GPU: catches what the interpreter does not (Triton's type checks, None in a
returned tuple, an older Triton's missing features) before device time is spent.

    python -m tools.compile_check [--arch 90] [--strategies lookback,chunk] [--quick]

Phase 1 (a child process under TRITON_INTERPRET=1): small problems through the public entry
points (``samu_tune.scan`` with each strategy's default config and, for ``lookback``, loop
configs with one and two rows and pipeline stages; forward and backward; with and without
resets, h0 and final state; the fused SAMU layer forward and backward; a decode step), every kernel launch
recorded: its argument types (a tensor's dtype and 16-byte alignment, an int's value where
Triton specialises it, None) and constexprs.  Phase 2 (this process, no interpreter):
each distinct launch compiled through Triton's NVIDIA backend to PTX, then ptxas; prints
registers, spills and failures (with the innermost error).  Exit status 1 if any fails.
Run it with the Triton of the GPU machine too (a venv with ``pip install triton==3.6.0``;
``--record-python`` names a Python with the newest Triton for phase 1; it runs
``python -m tools.compile_check --record`` in the repository root, so that Python needs torch
and Triton, not samu_tune installed).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def nvidia_bin() -> Path:
    """The folder of the CUDA tools shipped in the triton wheel (ptxas, cuobjdump)."""
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def ptxas(ptx: str, arch: int = 90, sass: bool = False) -> tuple[bool, str]:
    """``ptxas -v`` of ``ptx`` for sm_``arch``a: (True, its register and spill lines joined by
    `` | ``, and with ``sass`` a digest of the machine code: ``sass <12 hex>``), or (False,
    the end of its error output)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        res = subprocess.run([str(nvidia_bin() / "ptxas"), f"-arch=sm_{arch}a", "-v",
                              str(Path(tmp) / "k.ptx"), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
        if res.returncode:
            return False, res.stderr.strip()[-500:]
        info = " | ".join(ln.split("ptxas info    : ")[-1].strip()
                          for ln in res.stderr.splitlines()
                          if "registers" in ln or "spill" in ln)
        if sass:
            info += f" | sass {sass_digest(Path(tmp) / 'k.cubin')}"
    return True, info


def sass_digest(cubin: Path) -> str:
    """sha256 (12 hex) of the cubin's SASS instructions (``cuobjdump -sass``, addresses and
    encodings dropped): equal digests mean the same machine code, whatever the source's line
    numbers or file names."""
    import hashlib
    import re
    out = subprocess.run([str(nvidia_bin() / "cuobjdump"), "-sass", str(cubin)],
                         capture_output=True, text=True, check=True).stdout
    code = [re.sub(r"^\s*/\*[0-9a-f]{4,}\*/\s*", "", ln).split(";")[0].strip()
            for ln in out.splitlines() if re.match(r"^\s*/\*[0-9a-f]{4,}\*/", ln)]
    return hashlib.sha256("\n".join(code).encode()).hexdigest()[:12]


# ------------------------------------------------------------------ phase 1: record ----------
def describe(v) -> dict:
    """A launch argument as the compiler sees it: a tensor's dtype and 16-byte alignment, an
    int's value (Triton specialises 1 and multiples of 16), None, a bool."""
    import torch
    if isinstance(v, torch.Tensor):
        return {"ptr": str(v.dtype).replace("torch.", ""), "align16": v.data_ptr() % 16 == 0}
    if v is None:
        return {"none": True}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, float):
        return {"float": v}
    return {"other": repr(v)}


@contextlib.contextmanager
def recording(seen: dict, execute: bool = True):
    """Under the interpreter: every kernel launch inside the block recorded into ``seen``
    (one entry per distinct launch: module, kernel, described arguments, options); the
    kernels still run unless ``execute`` is False (their outputs are then garbage)."""
    import triton.runtime.interpreter as interp

    original = interp.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        names = self.arg_names
        bound = dict(zip(names, args))
        bound.update(kwargs)
        launch = {"module": fn.__module__, "name": fn.__name__,
                  "args": {k: describe(v) for k, v in bound.items() if k in names},
                  "options": {k: v for k, v in kwargs.items() if k not in names}}
        seen.setdefault(json.dumps(launch, sort_keys=True), launch)
        if execute:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    interp.InterpretedFunction.run = run
    try:
        yield seen
    finally:
        interp.InterpretedFunction.run = original


def _record(out: Path, strategies: list[str], quick: bool) -> None:
    seen: dict = {}
    with recording(seen):
        _exercise(strategies, quick)
    out.write_text(json.dumps(list(seen.values()), indent=1))


def _exercise(strategies: list[str], quick: bool) -> None:
    import torch
    import samu_tune
    from samu_tune import registry
    from samu_tune.device import device_info
    from samu_tune.ops.scan.problem import ScanProblem

    gen = torch.Generator().manual_seed(0)
    shapes = [(2, 70, 136), (1, 33, 24)] if not quick else [(2, 70, 136)]
    for B, L, M in shapes:
        problem = ScanProblem(B=B, L=L, M=M, dtype="bfloat16", device="cpu")
        for strat in registry.all_strategies():
            if strategies and strat.name not in strategies:
                continue
            if strat.reasons(problem, device_info("cpu")):
                continue                    # not a Triton strategy (or not for this shape)
            configs = [strat.default_config(problem)]
            if "intra" in strat.config_model.model_fields:     # the chunk family's walk
                configs += [c for c in strat.configs(problem) if c.intra == "walk"][:1]
            if strat.name == "lookback":
                configs += [c for c in strat.configs(problem)
                            if c.inner == "loop" and c.lookback == "decoupled" and c.sub == 1
                            and c.lookback_width == 1][:2]
                configs += [c for c in strat.configs(problem)
                            if c.inner == "loop" and c.rows == 2][:1]
                configs += [c for c in strat.configs(problem)
                            if c.inner == "loop" and c.stages > 1][:2]
            for cfg in configs:
                for resets, h0, final in ((False, False, False), (True, True, True)):
                    _scan_once(samu_tune, strat.name, cfg, B, L, M, resets, h0, final, gen)
    if not strategies or "layer" in strategies:
        for B, L, M in shapes[:1]:
            layer = samu_tune.SAMU(M, strategy="fused")
            x = torch.randn(B, L, 2 * M, generator=gen).to(torch.bfloat16).requires_grad_()
            y, _ = layer(x)
            y.float().sum().backward()
            with torch.no_grad():
                layer(x)
                layer.step(x[:, 0].detach())


def _scan_once(samu_tune, name, cfg, B, L, M, resets, h0, final, gen) -> None:
    import torch

    def rnd(*shape, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen) * 0.5).to(dtype).requires_grad_()

    eta, delta = rnd(B, L), rnd(B, L)
    nu_log, theta_log = rnd(M), rnd(M)
    br, bi = rnd(B, L, M, dtype=torch.bfloat16), rnd(B, L, M, dtype=torch.bfloat16)
    seg = None
    if resets:
        seg = torch.arange(L).repeat(B, 1) % 17
    state = (rnd(B, M), rnd(B, M)) if h0 else None
    out = samu_tune.scan(eta, delta, nu_log, theta_log, br, bi, initial_state=state,
                         segment_pos=seg, output_final_state=final, strategy=(name, cfg))
    loss = out.real.float().sum() + out.imag.float().sum()
    if final:
        loss = loss + out.final_state[0].sum()
    loss.backward()


# ------------------------------------------------------------------ phase 2: compile ---------
def _signature(fn, launch):
    sig, const, attrs = {}, {}, {}
    args = launch["args"]
    for i, p in enumerate(fn.params):
        name = p.name
        d = args.get(name)
        if d is None:                       # not passed: its default
            if p.is_constexpr:
                sig[name], const[name] = "constexpr", p.default
                continue
            raise ValueError(f"{name} not recorded")
        if p.is_constexpr:
            value = d.get("int", d.get("bool", d.get("float")))
            sig[name], const[name] = "constexpr", None if d.get("none") else value
        elif d.get("none"):
            sig[name], const[name] = "constexpr", None
        elif "ptr" in d:
            short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "i32",
                     "int64": "i64", "float64": "fp64", "bool": "i1", "uint8": "u8"}[d["ptr"]]
            sig[name] = "*" + short
            if d["align16"]:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif "int" in d:
            v = d["int"]
            if v == 1 and not p.do_not_specialize:
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i64" if abs(v) >= 2 ** 31 else "i32"
                if v % 16 == 0 and not p.do_not_specialize:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif "float" in d:
            sig[name] = "fp32"
        elif "bool" in d:
            sig[name] = "i1"
    return sig, const, attrs


def ptx_of(fn, sig: dict, const: dict, attrs: dict, arch: int = 90, **options) -> str:
    """The PTX of ``fn`` (a JITFunction) for sm_``arch`` through Triton's NVIDIA backend, the
    signature in ASTSource's terms (``"*bf16"``, ``"i32"``, ``"constexpr"`` with ``const``),
    ``options`` the launch's (num_warps, ...)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(fn, sig, const, attrs)
    target = GPUTarget("cuda", arch, 32)
    backend = CUDABackend(target)
    opts = backend.parse_options(options)
    stages: dict = {}
    backend.add_stages(stages, opts, src.language)
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    mod = src.make_ir(target, opts, backend.get_codegen_implementation(opts),
                      backend.get_module_map(), ctx)
    meta = {"hash": "0", "target": target, **opts.__dict__}
    for ext in ("ttir", "ttgir", "llir", "ptx"):
        if ext in stages:                    # a Gluon kernel starts at ttgir
            mod = stages[ext](mod, meta)
    return mod


def _compile(launch, arch: int, sass: bool = False) -> str:
    import importlib

    fn = getattr(importlib.import_module(launch["module"]), launch["name"])
    sig, const, attrs = _signature(fn, launch)
    # PTX 8.7: what the ptxas in the wheel reads (a CPU-only box has no driver to ask)
    mod = ptx_of(fn, sig, const, attrs, arch, ptx_version=87, **{
        k: v for k, v in launch["options"].items()
        if k in ("num_warps", "num_stages", "enable_fp_fusion")})
    ok, info = ptxas(mod, arch, sass)
    if not ok:
        raise RuntimeError(info)
    return info


def _innermost(exc: BaseException) -> str:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {str(exc)[-300:]}"


def _plans(configs: list[tuple[int, int, int]], quick: bool):
    """(plan, dtype, itemsize) of read-once loop configs (chunk, block_m, warps) for each
    dtype (the first config and bf16 alone when ``quick``)."""
    from samu_tune.ops.scan.strategies.lookback import LookbackConfig, LookbackPlan
    dtypes = ["bfloat16"] if quick else ["bfloat16", "float32", "float16"]
    for chunk, block_m, warps in configs[:1 if quick else len(configs)]:
        plan = LookbackPlan.of(LookbackConfig(chunk=chunk, block_m=block_m, num_warps=warps,
                                              inner="loop"), once=True)
        for dtype in dtypes:
            yield plan, dtype, {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]


def _gluon_launch(kernel, keywords: dict, dtype: str, rows: tuple[str, ...],
                  ptr_types: dict[str, str], none: set[str]) -> dict:
    """One Gluon launch in the recorded format: the strategy's ``keywords`` (the options
    split off), ``dtype`` pointers for the row arrays (names starting with ``rows``), else
    ``ptr_types``' or float32 ones, None for the names in ``none``, the other arguments
    runtime ints (not specialised)."""
    kw = dict(keywords)
    options = {k: kw.pop(k) for k in list(kw) if not k.isupper()}
    args = {}
    for p in kernel.params:
        if p.name in kw:
            args[p.name] = {"bool" if isinstance(kw[p.name], bool) else "int": kw[p.name]}
        elif p.name in none:
            args[p.name] = {"none": True}
        elif p.name.endswith("_ptr"):
            ptr = dtype if p.name.startswith(rows) else ptr_types.get(p.name, "float32")
            args[p.name] = {"ptr": ptr, "align16": True}
        else:
            args[p.name] = {"int": 100003}
    return {"module": kernel.__module__, "name": kernel.__name__, "args": args,
            "options": options}


def gluon_launches(quick: bool) -> list[dict]:
    """The Gluon kernels' launches, which the interpreter cannot record: the read-once
    look-back forward (``lookback_once``) for its benchmark configs, in the recorded format,
    its keywords from the strategy itself.  Each dtype, with and without resets and h0."""
    from samu_tune.ops.scan.strategies import lookback_once as once
    if once.once_kernels is None:
        return []
    kernel = once.once_kernels.lookback_once_forward
    out = []
    for plan, dtype, itemsize in _plans([(64, 256, 2), (32, 128, 4), (64, 512, 4)], quick):
        for resets, h0 in ((False, False), (True, True)):
            none = ({"seg_ptr"} if not resets else set()) | (
                {"h0_r_ptr", "h0_i_ptr"} if not h0 else set())
            out.append(_gluon_launch(kernel, once._keywords(plan, resets, h0, itemsize), dtype,
                                     ("x_r", "x_i", "y_r", "y_i"),
                                     {"sync_ptr": "int32", "seg_ptr": "int64"}, none))
    return out


def staged_backward_launches(quick: bool) -> list[dict]:
    """The ``lookback_staged`` backward's launches (Gluon, not recordable under the
    interpreter) for its benchmark configs, each dtype, with and without h0 and a final-state
    gradient, its keywords from the strategy itself."""
    from samu_tune.ops.scan.strategies import lookback_staged as staged
    if staged.backward_kernels is None:
        return []
    kernel = staged.backward_kernels.lookback_once_backward
    out = []
    for plan, dtype, itemsize in _plans([(32, 256, 2), (64, 128, 2), (64, 512, 4)], quick):
        for state in (False, True):
            none = set() if state else {p.name for p in kernel.params
                                        if p.name.startswith(("h0", "gh0", "end"))}
            out.append(_gluon_launch(kernel, staged._keywords(plan, state, state, itemsize),
                                     dtype, ("x_", "y_", "gx_"), {"sync_ptr": "int32"}, none))
    return out


def _label(launch) -> str:
    const = {k: v.get("int", v.get("bool")) for k, v in launch["args"].items()
             if k.isupper() and ("int" in v or "bool" in v)}
    nones = sorted(k for k, v in launch["args"].items() if v.get("none"))
    return (f"{launch['name']} {launch['options']} "
            f"{' '.join(f'{k}={v}' for k, v in const.items())} none={len(nones)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--strategies", default="", help="comma list (and 'layer'); default: all")
    ap.add_argument("--quick", action="store_true", help="one problem shape")
    ap.add_argument("--record-python", default=sys.executable,
                    help="the Python of phase 1 (the interpreter of an older Triton may not run "
                         "the kernels: record with the newest, compile with the old)")
    ap.add_argument("--launches", type=Path,
                    help="a launches file: phase 1 skipped if it exists, else written there")
    ap.add_argument("--sass", action="store_true",
                    help="print a digest of each launch's machine code (compare two trees' "
                         "outputs to show a refactoring left the compiled code unchanged)")
    ap.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    wanted = [s for s in args.strategies.split(",") if s]
    if args.record:
        _record(args.record, wanted, args.quick)
        return 0
    import triton
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        rec = (args.launches or Path(tmp) / "launches.json").resolve()  # the child runs in ROOT
        if not rec.exists():
            env = dict(os.environ, TRITON_INTERPRET="1")
            cmd = [args.record_python, "-m", "tools.compile_check", "--record", str(rec)]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--strategies", ",".join(wanted)] if wanted else []
            subprocess.run(cmd, env=env, check=True, cwd=ROOT)
        launches = json.loads(rec.read_text())
    if not wanted or "lookback_once" in wanted:
        launches += gluon_launches(args.quick)
    if not wanted or "lookback_staged" in wanted:
        launches += staged_backward_launches(args.quick)
    print(f"triton {triton.__version__}: {len(launches)} distinct launches recorded in "
          f"{time.time() - t0:.0f} s; compiling for sm_{args.arch}", flush=True)
    os.environ.pop("TRITON_INTERPRET", None)
    failed = 0
    for launch in launches:
        t1 = time.time()
        try:
            info = _compile(launch, args.arch, args.sass)
            print(f"  ok   {time.time() - t1:5.1f}s {_label(launch)}: {info}", flush=True)
        except Exception as exc:  # every failure reported, the rest still compiled
            failed += 1
            print(f"  FAIL {_label(launch)}: {_innermost(exc)}", flush=True)
    print(f"{failed} of {len(launches)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
