"""Strategy ``lookback_once``: the look-back scan whose forward reads each input once.

The ``lookback`` strategy's loop walk with one change: the forward stages its chunk in
shared memory (a Gluon kernel, :mod:`samu_tune.kernels.lookback_once`) and walks it twice
from there instead of reading it from memory twice.  The backward, the workspace, the head
and the control table are the ``lookback`` strategy's (its loop walk; the config's ``rows``,
``stages`` and ``lookback_width`` serve the backward only).  CUDA only (Gluon has no
interpreter), sm_80+ (cp.async), decoupled look-back (float atomics in the backward), M a
multiple of 8 (16-byte row copies); a launch whose br, bi or outputs are not 16-byte aligned
runs the Triton forward instead.
"""
from __future__ import annotations

import functools
import sys

import torch

from samu_tune import occupancy
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import fast
from samu_tune.ops.scan.capability import Capability
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import lookback, lookback_config
from samu_tune.ops.scan.strategies.lookback_config import LookbackConfig
from samu_tune.problem import TORCH_DTYPES
from samu_tune.registry import Strategy, register

try:
    from samu_tune.kernels import lookback_once as once_kernels
    from samu_tune.kernels import lookback_once_parts as once_parts
except ImportError:              # a Triton without Gluon: the strategy is not registered
    once_kernels = once_parts = None

# the chunk staged per program: at most this many bytes of shared memory (both arrays), so
# that at least one program fits an SM of sm_80+ (164-227 KB)
_MAX_STAGED_BYTES = 128 * 1024
_CHUNKS = (32, 64)
# commit groups per chunk (the summary starts on the first) and rows per walk step by chunk
# (their loads issued together): each group four walk steps.  Against four groups of 4 rows,
# on an H100: 64-step chunks 3-8% faster forward at four shapes (64x128x2 at (8, 8192, 1024)
# 0.233 ms against 0.241, at (2, 65536, 128) 0.089 against 0.097), 32-step chunks 1%
# (0.232 against 0.235); eight groups or 2 rows per step were slower (docs/performance.md)
_COPY_GROUPS = 2
_UNROLL = {32: 4, 64: 8}
# the walks step through each commit group whole: a row left over would be skipped
assert all(c % _COPY_GROUPS == 0 and (c // _COPY_GROUPS) % _UNROLL[c] == 0 for c in _CHUNKS)
# predecessors the forward's look-back reads per poll: against one, on an H100, 4 ran
# (2, 65536, 128) 64x128x2 in 0.081 ms against 0.092 and (1, 16384, 256) in 0.029 against
# 0.035, within 3% elsewhere on the grid (docs/performance.md)
_LOOKBACK_WIDTH = 4
_MODES_MULTIPLE = 8              # M a multiple of it: rows copied as 16-byte vectors (bf16)
_MIN_FIT_TILE = 128              # the narrowest mode tile :func:`fit` narrows to


def staged_bytes(problem: ScanProblem, cfg: LookbackConfig) -> int:
    """Shared memory a program stages: its chunk of br and bi, [chunk, block_m] each."""
    return 2 * cfg.chunk * cfg.block_m * TORCH_DTYPES[problem.dtype].itemsize


def valid(problem: ScanProblem, cfg: LookbackConfig) -> bool:
    """A valid ``lookback`` loop config (the backward's) of decoupled look-back whose forward
    chunk is 32 or 64 steps and fits ``_MAX_STAGED_BYTES``, M a multiple of 8.  The fields
    only the backward reads (rows, stages, look-back width) are checked as the training
    problem's, forward too: a forward entry's config then also serves training, and the
    forward binary is the same for all of them (no compile)."""
    return (cfg.inner == "loop" and cfg.lookback == "decoupled"
            and problem.M % _MODES_MULTIPLE == 0
            and cfg.chunk in _CHUNKS and staged_bytes(problem, cfg) <= _MAX_STAGED_BYTES
            and lookback_config.valid(problem.model_copy(update={"backward": True}), cfg))


def fitted_tile(M: int, block_m: int, num_warps: int) -> tuple[int, int]:
    """(block_m, num_warps) of the widest tile, down to ``_MIN_FIT_TILE`` modes, that covers
    M with the fewest modes (``block_m`` where a narrower one covers no fewer), at the same
    lanes per thread where 2 warps at least allow that, else at 2 warps (256 modes at 2 warps,
    4 lanes, become 128 at 2 warps, 2 lanes).  The forward stages and walks whole tiles,
    padding included: at (24, 700, 384) on an H100, 128-mode tiles ran 0.0347 ms against
    0.0417 for 256-mode ones (two tiles covering 512 modes).  Only M = 384 was measured;
    other M (above 512 too) follow the same count of padded modes."""
    lanes = block_m // (32 * num_warps)
    best = block_m
    tile = block_m // 2
    while tile >= _MIN_FIT_TILE:
        if lookback_config.padded_modes(M, tile) < lookback_config.padded_modes(M, best):
            best = tile
        tile //= 2
    if best == block_m:
        return block_m, num_warps
    return best, max(2, best // (32 * lanes))


def fit(problem: ScanProblem, cfg: LookbackConfig) -> LookbackConfig:
    """A nearest entry's config on this problem's M: its mode tile narrowed where a narrower
    one covers fewer padded modes (:func:`fitted_tile`).  Its callers keep the entry's config
    where the fitted one is not valid (dispatch) or not in the search space (the tuner)."""
    block_m, num_warps = fitted_tile(problem.M, cfg.block_m, cfg.num_warps)
    if block_m == cfg.block_m:
        return cfg
    return cfg.model_copy(update=dict(block_m=block_m, num_warps=num_warps))


def default(problem: ScanProblem) -> LookbackConfig:
    """Forward: 64-step chunks of 128 modes at 2 warps (32-step chunks where 64 do not fit),
    the fastest or within 0.5% of the fastest forward on an H100 at the six grid shapes it
    serves: against 32-step chunks of 256 modes, 0.0365 / 0.0208 / 0.0248 ms against 0.0451 /
    0.0237 / 0.0261 at (1, 16384, 256), (1, 2048, 1024), (32, 512, 256), and 0.0723 / 0.2320
    against 0.0719 / 0.2311 at (16, 1024, 1024), (8, 8192, 1024) (docs/performance.md).
    With the look-back 4 wide (``_LOOKBACK_WIDTH``) the large shapes lean the other way,
    0.071 / 0.234 against 0.068 / 0.228 kernel ms, and the small ones further this way
    ((1, 16384, 256) 0.029 against 0.037): it stays the default.  Training: 64-step chunks
    (the backward walk's pipeline stages need them) of 256 modes (128 where M < 256 or where
    128-mode tiles cover fewer modes: :func:`fitted_tile`), the backward fields those of the
    ``lookback`` default (at (8, 8192, 1024): one row, 6 stages, 0.655 ms against 0.678 for
    two rows)."""
    fields = dict(inner="loop", lookback="decoupled")
    if problem.backward:
        base = lookback_config.default(problem)
        block_m, num_warps = fitted_tile(problem.M, 256 if problem.M >= 256 else 128, 2)
        candidates = [dict(chunk=64, rows=base.rows, stages=base.stages,
                           lookback_width=base.lookback_width), dict(chunk=64), dict(chunk=32)]
    else:
        block_m, num_warps = 128, 2
        candidates = [dict(chunk=64), dict(chunk=32)]
    fields.update(block_m=block_m, num_warps=num_warps)
    for extra in candidates:
        cfg = LookbackConfig(**fields, **extra)
        if valid(problem, cfg):
            return cfg
    return LookbackConfig(**fields, chunk=64)


@functools.lru_cache(maxsize=256)
def _keywords(plan: lookback.LookbackPlan, resets: bool, has_h0: bool, itemsize: int) -> dict:
    """The Gluon kernel's keywords per specialisation (one dict, kept: the direct launch keys
    it by identity)."""
    vec = 16 // itemsize
    return dict(HAS_RESETS=resets, HAS_H0=has_h0, CHUNK=plan.chunk, BLOCK_M=plan.block_m,
                GROUPS=_COPY_GROUPS, UNROLL=_UNROLL[plan.chunk], VEC=vec, WIDTH=_LOOKBACK_WIDTH,
                COPY_COLS=min(32, plan.block_m // vec), num_warps=plan.num_warps,
                **LAUNCH_OPTIONS)


def can_run(M: int, *rows: torch.Tensor) -> bool:
    """Whether a forward launch can run the Gluon kernel: M a multiple of 8 and every row
    array (br, bi, the outputs) 16-byte aligned."""
    return M % _MODES_MULTIPLE == 0 and all(t.data_ptr() % 16 == 0 for t in rows)


# the persistent forward's grid per specialisation and device
_GRID = occupancy.PersistentGrid()


def launch(plan: lookback.LookbackPlan, slots: int, sync, carry, eta, delta, nu_log, theta_log,
           seg, ctl, x, h0, y, end, B: int, L: int, M: int, nmt: int, nch: int, ticket0: int,
           status0: int) -> None:
    """The read-once forward on the head and summaries of a look-back launch
    (:func:`samu_tune.ops.scan.strategies.lookback._launch`, where :func:`can_run`): the
    kernel's programs are persistent, as many as the device runs at once
    (:class:`samu_tune.occupancy.PersistentGrid`)."""
    kwargs = _keywords(plan, seg is not None, h0[0] is not None, x[0].element_size())
    _GRID.launch(_once_kernel, slots, (
        sync, carry, eta, delta, nu_log, theta_log, seg, ctl, x[0], x[1], h0[0], h0[1], y[0],
        y[1], end[0], end[1], B, L, M, nmt, nch, ticket0, status0), kwargs, x[0])


def run(inputs, cfg: LookbackConfig):
    return lookback.lookback_scan(inputs, lookback.LookbackPlan.of(cfg, once=True))


if once_kernels is not None:
    _once_kernel = fast(once_kernels.lookback_once_forward)
    lookback.ONCE_FORWARD = sys.modules[__name__]
    STRATEGY = register(Strategy(
        name="lookback_once",
        description="lookback whose forward stages each chunk in shared memory (Gluon): "
                    "inputs read once; CUDA sm_80+",
        capability=Capability(devices=frozenset({"cuda"}), interpreter=False,
                              deterministic=False, min_compute_capability=(8, 0),
                              modes_multiple=_MODES_MULTIPLE),
        run=run,
        config_model=LookbackConfig,
        valid=valid,
        default=default,
        fit=fit,
        workspace_bytes=lookback.workspace_bytes,
        priority=10,
        modules=(sys.modules[__name__], lookback_config, sys.modules[lookback.__name__],
                 occupancy, once_kernels, once_parts, *lookback.KERNEL_MODULES),
        autograd=lambda cfg: (lookback._LookbackScan, lookback.LookbackPlan.of(cfg, once=True)),
    ))
