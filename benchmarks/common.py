"""What the benchmarks and tools share: shape and config parsing, ``--out`` and result
writing, the benchmark clock, the candidates a scan benchmark times, and the compile pool.

``samu_tune`` is imported inside the functions that use it, so a module importing this one
loads only what it calls: the register tools compile without a GPU, and the baseline runs of
``tools/gpu_run.sh`` put another tree's ``samu_tune`` first on the path.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]

# the benchmark grid: bench_scan's tables (the README's and the shipped table's shapes) and
# bench_host's scan rows
GRID = [(1, 16384, 256), (2, 65536, 128), (32, 512, 256), (1, 2048, 1024), (4, 4096, 512),
        (16, 1024, 1024), (8, 8192, 1024), (64, 256, 64)]
# ten shapes off the grid and off the shipped table: B*M from 96 to 9216, L from 700 to
# 100000, M not a power of two (300, 700, 96, 200, 1000, 384), M % 8 != 0 (300, 700)
OFF_GRID = [(3, 5000, 300), (12, 3000, 700), (1, 100000, 96), (4, 16384, 256),
            (2, 32768, 128), (16, 2048, 512), (6, 1000, 200), (1, 7000, 1000),
            (24, 700, 384), (2, 20000, 96)]
# the layer shapes of bench_layer and bench_fused_configs (grid shapes: the seed's binaries
# are cached by the grid run)
LAYER_SHAPES = [(4, 4096, 512), (1, 16384, 256)]
# arrays of [B, L, M] a scan must move: forward reads br, bi and writes real, imag;
# forward+backward about 10
TRAFFIC_ARRAYS = {"forward": 4, "train": 10}


# ---------------------------------------------------------------- parsing ---------------------

def parse_shape(text: str) -> tuple[int, int, int]:
    """``8x8192x1024`` or ``8,8192,1024``."""
    parts = re.split(r"[x,]", text.strip())
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: BxLxM or B,L,M")
    return tuple(int(p) for p in parts)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``4x4096x512,1x16384x256`` or ``4,4096,512;1,16384,256`` (one shape: ``1,64,128``)."""
    sep = r"[,;\s]+" if "x" in text else r"[;\s]+"
    shapes = [parse_shape(p) for p in re.split(sep, text.strip()) if p]
    if not shapes:
        raise argparse.ArgumentTypeError(f"bad shapes {text!r}: B,L,M[;B,L,M] or BxLxM,...")
    return shapes


_LOOKBACK_SPEC = re.compile(r"(\d+(?:x\d+){2,3})([cl]*)(?:r(\d))?(?:w(\d+))?(?:p(\d+))?")


def parse_lookback_config(spec: str):
    """A ``LookbackConfig`` from ``CHUNKxBLOCK_MxWARPS[xSUB]`` and optional letters: ``c``
    chained look-back, ``l`` loop-inner (``64x512x4l``, ``64x512x4cl``), then ``rN``: N rows
    per loop step (``32x512x4lr2``), ``wN``: look-back width N (``128x32x4w8``) and ``pN``: N
    software-pipeline stages of the loop walks (``64x256x2lr2p4``)."""
    from samu_tune.ops.scan.strategies.lookback import LookbackConfig
    m = _LOOKBACK_SPEC.fullmatch(spec)
    if m is None:
        raise ValueError(
            f"bad config spec {spec!r}: CHUNKxBLOCK_MxWARPS[xSUB][c][l][r2][wN][pN]")
    body, flags, rows, width, stages = m.groups()
    vals = [int(v) for v in body.split("x")] + [1]
    return LookbackConfig(chunk=vals[0], block_m=vals[1], num_warps=vals[2], sub=vals[3],
                          lookback="chained" if "c" in flags else "decoupled",
                          inner="loop" if "l" in flags else "tile", rows=int(rows or 1),
                          lookback_width=int(width or 1), stages=int(stages or 1))


def lookback_spec(cfg) -> str:
    """:func:`parse_lookback_config`'s spec of ``cfg`` (plus ``/windowN``, a field the spec
    does not hold)."""
    s = f"{cfg.chunk}x{cfg.block_m}x{cfg.num_warps}" + (f"x{cfg.sub}" if cfg.sub != 1 else "")
    s += ("c" if cfg.lookback == "chained" else "") + ("l" if cfg.inner == "loop" else "")
    s += f"r{cfg.rows}" if cfg.rows != 1 else ""
    s += f"w{cfg.lookback_width}" if cfg.lookback_width != 1 else ""
    s += f"p{cfg.stages}" if cfg.stages != 1 else ""
    return s + (f"/window{cfg.window}" if cfg.window != 1 else "")


def timed_configs(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    """A bench_scan ``bench.json``'s strategy rows as (shape, dtype, mode) -> {strategy name
    and config as JSON: GPU ms} (:func:`config_key`)."""
    times: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["kind"] != "strategy":
            continue
        for mode in ("forward", "train"):
            if r.get(f"{mode}_ms") is not None:
                times.setdefault((tuple(r["shape"]), r["dtype"], mode), {})[
                    config_key(r["name"], r["config"])] = r[f"{mode}_ms"]
    return times


def run_device(data: dict):
    """The GPU of a recorded benchmark run (``bench.json`` / ``bench_tuner.json``) as
    :class:`samu_tune.device.DeviceInfo`: its recorded signature, else the shipped table's of
    the same name, else the name on sm90 with 132 SMs (the H100 SXM and H200 of the recorded
    runs)."""
    from samu_tune import cache
    from samu_tune.device import DeviceInfo
    name = data["device"]
    sig = data.get("signature")
    if sig is None:
        stem = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
        shipped = sorted(p.stem for p in cache.shipped_path(f"{stem}-sm90-132sm").parent.glob(
            f"{stem}-sm*.json"))
        sig = shipped[0] if shipped else f"{stem}-sm90-132sm"
    cc, sms = re.fullmatch(r".*-sm(\d+)-(\d+)sm", sig).groups()     # "90", "100": minor last
    return DeviceInfo(kind="cuda", name=name, capability=(int(cc[:-1]), int(cc[-1])),
                      sm_count=int(sms))


def config_key(name: str, config) -> str:
    """A strategy's name and config as one string (keys of :func:`timed_configs`)."""
    return name + json.dumps(config, sort_keys=True)


def add_out(ap: argparse.ArgumentParser, default: Optional[str] = "bench_out") -> None:
    """``--out DIR`` (a Path): default ``$OUT``, else ``default``; required when both are
    unset."""
    fallback = os.environ.get("OUT") or default
    ap.add_argument("--out", type=Path, default=None if fallback is None else Path(fallback),
                    required=fallback is None, help="output folder (default: $OUT, else "
                    f"{default or 'required'})")


# ---------------------------------------------------------------- results ---------------------

def error_text(exc: BaseException, limit: int = 500, first_line: bool = False) -> str:
    """``Type: message`` of a failure kept as a result (its first line only if asked)."""
    text = str(exc).strip()
    if first_line:
        text = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {text}"[:limit]


def write_json(path: Path, data) -> None:
    """``data`` as indented JSON at ``path`` (its folder made); written after every step, a
    run stopped at its time limit keeps what it measured."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


# ---------------------------------------------------------------- clocks ----------------------

def copy_bandwidth_tbps() -> float:
    """The current GPU's measured copy bandwidth, TB/s."""
    from samu_tune import timing
    return timing.copy_bandwidth(torch.cuda.current_device()) / 1e12


def floor_ms(shape, dtype: str, mode: str, tbps: float) -> float:
    """ms to move the scan's minimal traffic (:data:`TRAFFIC_ARRAYS`) at ``tbps``; a time's
    fraction of copy bandwidth is ``floor_ms / ms``."""
    B, L, M = shape
    elem = torch.finfo(getattr(torch, dtype)).bits // 8
    return TRAFFIC_ARRAYS[mode] * B * L * M * elem / (tbps * 1e12) * 1e3


def per_call_us(fn: Callable, calls: int, repeats: int = 7, warmup: int = 0,
                sync: Callable[[], None] = lambda: None) -> float:
    """Best of ``repeats`` wall times of ``calls`` back-to-back calls (``sync()`` before and
    after each loop), per call, in microseconds."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def time_call(call: Callable, reps_ms: float, do_bench: bool = False, device="cuda") -> dict:
    """Time of ``call()`` with the tuner's clock: ``ms`` (median), ``host_ms`` (median host
    time per call), ``samples``; ``do_bench_ms`` when asked.  On CUDA GPU time
    (:func:`samu_tune.timing.gpu_samples`), on the CPU wall time (as the tuner's CPU path)."""
    from samu_tune import timing
    device = torch.device(device)
    if device.type != "cuda":
        samples = []
        for _ in range(max(3, int(reps_ms))):
            t0 = timing.now()
            call()
            samples.append((timing.now() - t0) * 1e3)
            if len(samples) >= 3 and sum(samples) >= reps_ms:
                break
        return {"ms": timing.median(samples), "host_ms": None, "samples": len(samples)}
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    gpu, host = timing.gpu_for(device), []
    first = timing.gpu_samples(call, 1, gpu, host)
    n = timing.reps_for(first[0], device=device, target_ms=reps_ms, lo=5, hi=100)
    samples = first + timing.gpu_samples(call, n - 1, gpu, host)
    res = {"ms": timing.median(samples), "host_ms": timing.median(host), "samples": len(samples)}
    if do_bench:
        import triton.testing
        res["do_bench_ms"] = triton.testing.do_bench(call, warmup=25, rep=reps_ms,
                                                     return_mode="median")
    return res


# ---------------------------------------------------------------- candidates ------------------

@functools.lru_cache(maxsize=None)
def seed_module():
    """The seed copy (``seed_copy/samu_seed_readable.py``, carried to the device), imported
    once per process; None where it is absent."""
    path = ROOT / "seed_copy" / "samu_seed_readable.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("samu_seed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _seed_fn(variant: str):
    seed = seed_module()
    if variant == "seed_default":
        return lambda i: seed.samu_training_scan_dispatch(i.eta, i.delta, i.nu_log, i.theta_log,
                                                          i.br, i.bi)
    if variant.startswith("seed_chunk"):
        c = int(variant.removeprefix("seed_chunk"))
        return lambda i: seed.samu_chunk_scan(i.eta, i.delta, i.nu_log, i.theta_log, i.br, i.bi,
                                              chunk_size=c)
    if variant == "seed_tiled":
        return lambda i: seed.samu_tiled_serial_scan(i.eta, i.delta, i.nu_log, i.theta_log,
                                                     i.br, i.bi)[:2]
    raise ValueError(variant)


def accel_operands(eta, delta, nu_log, theta_log, br, bi):
    """accelerated_scan.complex's inputs: the materialised transition and the input, complex64
    [B, M, L] (built outside any timed call)."""
    from samu_tune.ops.scan.reference import transition
    with torch.no_grad():
        ar, ai = transition(eta, delta, nu_log, theta_log)
        forget = torch.complex(ar, ai).transpose(1, 2).contiguous()
        del ar, ai
        x = torch.complex(br.float(), bi.float()).transpose(1, 2).contiguous()
    return forget, x


def make_fn(kind: str, name: str, config: Optional[dict]):
    """``fn(ScanInputs) -> ScanOutput`` of a candidate that takes the scan's inputs: a
    registered strategy at ``config``, ``samu_tune.scan`` (kind ``scan``) or a seed variant."""
    import samu_tune
    from samu_tune import registry
    from samu_tune.ops.scan.tensors import ScanOutput
    if kind == "strategy":
        strat = registry.get(name)
        cfg = strat.parse_config(config)
        return lambda i: strat.run(i, cfg)
    if kind == "scan":
        return lambda i: samu_tune.scan(i.eta, i.delta, i.nu_log, i.theta_log, i.br, i.bi)
    if kind == "seed":
        f = _seed_fn(name)
        return lambda i: ScanOutput(*tuple(f(i))[:2])
    raise ValueError(kind)


def make_call(kind, name, config, problem, device="cuda"):
    """A zero-argument call that runs one timed unit of the candidate on ``problem`` (forward,
    or forward + backward when ``problem.backward``) on the next input set of a pool, as the
    tuner's :class:`samu_tune.ops.scan.timing.Step` does.  accelerated_scan (kind ``accel``) gets its
    complex inputs prepared outside the call (its transition and layout are not timed)."""
    from samu_tune.ops.scan import timing as scan_timing
    step = scan_timing.Step(problem, device, pool=2, seed=1000)
    if kind != "accel":
        fn = make_fn(kind, name, config)
        return lambda: step(fn, step.next_inputs())
    from accelerated_scan.complex import scan as accel_scan
    i = step.next_inputs()
    forget, x = accel_operands(i.eta, i.delta, i.nu_log, i.theta_log, i.br, i.bi)
    if not problem.backward:
        def forward():
            with torch.no_grad():
                return accel_scan(forget, x)
        return forward
    forget, x = forget.requires_grad_(True), x.requires_grad_(True)
    grad = torch.randn_like(x)

    def train():
        out = accel_scan(forget, x)
        torch.autograd.grad(out, (forget, x), grad)
    return train


# ---------------------------------------------------------------- compile pool ----------------

def spawn_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes (CUDA needs spawn); they share Triton's disk
    cache, so what they compile the timed process only loads."""
    return cf.ProcessPoolExecutor(max_workers=workers,
                                  mp_context=torch.multiprocessing.get_context("spawn"))


def _warm(task):
    kind, name, config, shape, dtype, modes = task
    from samu_tune.ops.scan.problem import ScanProblem
    torch.cuda.set_device(0)
    t0 = time.perf_counter()
    try:
        B, L, M = shape
        for mode in modes:
            problem = ScanProblem(B=B, L=L, M=M, dtype=dtype, device="cuda",
                                  backward=mode == "train")
            make_call(kind, name, config, problem)()
        torch.cuda.synchronize()
        return task, time.perf_counter() - t0, None
    except Exception as exc:  # recorded, the benchmark goes on
        return task, time.perf_counter() - t0, error_text(exc)


def warm_all(tasks, workers: int) -> dict:
    """Run every ``(kind, name, config, shape, dtype, modes)`` task once in a spawned pool
    (compiles its kernels); per task (``json.dumps(task[:5])``) its seconds and error."""
    out = {}
    with spawn_pool(workers) as pool:
        for task, secs, err in pool.map(_warm, tasks):
            out[json.dumps(task[:5], default=str)] = {"seconds": secs, "error": err}
            print(f"  warm {task[0]}:{task[1]} {task[3]} {task[4]}: {secs:.1f}s"
                  + (f" ERROR {err}" if err else ""), flush=True)
    return out
