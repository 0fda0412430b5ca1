"""The ``lookback`` strategy's config space: :class:`LookbackConfig`, which configs are valid for
a problem (:func:`valid`) and the untuned default (:func:`default`)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from samu_tune import intmath
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.problem import TORCH_DTYPES


# register budget, in tile elements per thread.  Above 8 per thread the tile configs spill
# (ptxas, sm_90), yet spilling 32-per-thread configs beat the 8-per-thread ones at
# (8, 8192, 1024) on the H200 (docs/performance.md), so up to 32 per thread stay in the
# space and the tuner decides.
_MAX_TILE = 8192
_MAX_PER_THREAD = 32
_MAX_TILE_BLOCK_M = 128

# loop-inner configs (``inner="loop"``): rows walked per program and lanes per thread.  A
# thread holds a few [BLOCK_M]-vectors, whatever the chunk; the lanes per thread set the
# bytes each thread has in flight per row (a row's controls come from a per-token table, the
# next row's loads are issued before the current row's math).  Up to 8 lanes per thread
# compile for sm_90 without spills (registers per config: docs/performance.md).
_LOOP_CHUNKS = (32, 64, 128)
_LOOP_LANES_PER_THREAD = (2, 4, 8)
_LOOP_WARPS = (2, 4)
# rows per walk step (``rows`` 2: both rows' loads issued together, then the two dependent
# steps: twice the bytes in flight per program) at 2 and 4 lanes per thread, chunks up to 64
# (8 more configs).  Two rows raise the registers 1.3-1.9x without spills (sm_90), so fewer
# programs are resident: the tuner weighs it.  8 lanes per thread, already the most
# registers at one row, are left out (registers per config: docs/performance.md).
_LOOP_ROWS2_LANES = (2, 4)
_LOOP_ROWS2_MAX_CHUNK = 64

# look-back width (``lookback_width``, decoupled only): predecessors read per look-back poll,
# their statuses in one vector atomic and their payloads in one L2 round trip, so a walk over
# n predecessors takes ~n / width polls instead of n.  A poll holds width x 4 payload vectors
# of the lanes a thread owns (fp32).  ptxas for sm_90 issues them all before the first use
# while width x lanes per thread <= 16; beyond that it spills and serialises the loads (a
# round trip per row) (registers and spills per config: docs/performance.md).
# A width pays only where a walk can be longer than the next narrower width covers in a poll.
_MAX_WIDTH_LANES = 16
_WIDTH_BELOW = {8: 1, 16: 8}
# software-pipeline stages of the loop walks (``stages`` > 1): Triton's pipeliner copies the
# next stages - 1 steps' rows and controls into shared memory with cp.async (checked in the
# PTX of Triton 3.6: every row and control load of both walks, forward and backward), so a
# program has stages - 1 steps in flight without registers to hold them.  The staged bytes
# per program (stages x rows x the row arrays of a step) stay under _MAX_STAGED_BYTES so that
# shared memory leaves room for several programs per SM.  Stages 4-6 beat the register
# prefetch by 10-25% on the H200 at 64-step chunks of 2-4 lanes per thread; shorter walks are
# mostly prologue, and each stage costs registers, hence the limits below
# (docs/performance.md).
_MAX_STAGED_BYTES = 48 * 1024
_STAGED_MIN_CHUNK = 64
_STAGED_MAX_LANES = 4


class LookbackConfig(BaseModel):
    """Launch choices of the look-back scan.

    ``chunk``: time steps per program; ``block_m``: modes per program; ``num_warps``: warps
    per program; ``lookback``: ``decoupled`` (predecessor aggregates, fast, not bitwise
    reproducible) or ``chained`` (fixed combination order, deterministic); ``window``:
    chunks per published inclusive prefix in chained mode (1 in decoupled mode); ``sub``:
    tiles of ``chunk`` steps per program (a program's chunk is ``chunk * sub`` steps: sub > 1
    walks its tiles twice, summary then replay, for more bytes in flight per program and a
    ``sub`` times shorter look-back chain).  ``inner``: ``tile`` scans each [chunk, block_m]
    tile in registers (tl.associative_scan); ``loop`` walks the program's ``chunk * sub`` rows
    ``rows`` at a time on [block_m] vectors, twice (summary, then replay re-reading the inputs,
    from L2 while the chunks in flight fit it): few registers per thread, high occupancy.
    ``rows`` (loop only): rows per step of the loop-inner walks, their loads issued together
    (2: twice the bytes in flight per program, for 1.3-1.9x the registers: see
    ``_LOOP_ROWS2_LANES``).  ``lookback_width``
    (decoupled only): predecessors read per look-back poll (one vector status atomic, their
    payloads in one round trip: see ``_MAX_WIDTH_LANES``).  ``stages`` (loop only): 1, each
    walk step loads the next step's rows into registers; N > 1, the next N - 1 steps' rows
    are staged in shared memory by Triton's software pipeliner (cp.async): more bytes in
    flight per program without registers to hold the rows (the staging itself costs ~10-14
    registers per stage; see ``_MAX_STAGED_BYTES``).
    """

    model_config = ConfigDict(frozen=True)

    chunk: Literal[16, 32, 64, 128, 256] = 64
    block_m: Literal[16, 32, 64, 128, 256, 512, 1024] = 32
    num_warps: Literal[2, 4, 8] = 4
    lookback: Literal["decoupled", "chained"] = "decoupled"
    window: Literal[1, 8, 32] = 1
    sub: Literal[1, 4, 16] = 1
    inner: Literal["tile", "loop"] = "tile"
    rows: Literal[1, 2] = 1
    lookback_width: Literal[1, 8, 16] = 1     # predecessors per look-back poll (decoupled)
    stages: Literal[1, 4, 6] = 1     # loop walks: software-pipeline depth


def lanes_per_thread(cfg) -> int:
    """Modes of a [block_m] row vector each thread holds (loop-inner: per row)."""
    return cfg.block_m // (32 * cfg.num_warps)


def staged_bytes(problem: ScanProblem, cfg: LookbackConfig) -> int:
    """Shared memory the software pipeline of a loop config stages per program (0 at
    stages 1): stages steps of ``rows`` rows of the walk's [block_m] arrays (x; backward also
    the saved h) in the data dtype."""
    if cfg.stages == 1:
        return 0
    arrays = 4 if problem.backward else 2
    itemsize = TORCH_DTYPES[problem.dtype].itemsize
    return cfg.stages * cfg.rows * arrays * cfg.block_m * itemsize


def valid(problem: ScanProblem, cfg: LookbackConfig) -> bool:
    """Prune tiles mostly beyond M or L, tiles over the register budget, threads without
    elements, and decoupled look-back under deterministic mode.  Loop-inner configs: a small
    subspace (``_LOOP_*``: chunk, lanes per thread, warps, rows per step), sub 1, decoupled
    look-back (chained only under deterministic mode), so the tuner tries ~10-26 of them per
    problem (times the look-back widths); ``rows`` 2 only for loop configs of look-back width
    1.  A look-back width > 1: decoupled only, within the register budget
    (``_MAX_WIDTH_LANES``), and only where walks can be longer than a narrower width covers.
    ``stages`` > 1: loop configs of 64+-step chunks at <= 4 lanes per thread whose staged
    rows fit ``_MAX_STAGED_BYTES``."""
    if cfg.block_m > max(16, intmath.next_power_of_2(problem.M)):
        return False
    if cfg.chunk * cfg.sub > max(16, intmath.next_power_of_2(problem.L)):
        return False
    if cfg.inner == "loop":
        if (cfg.chunk not in _LOOP_CHUNKS or cfg.num_warps not in _LOOP_WARPS
                or lanes_per_thread(cfg) not in _LOOP_LANES_PER_THREAD
                or cfg.block_m % (32 * cfg.num_warps) or cfg.sub != 1):
            return False
        if cfg.rows != 1 and (lanes_per_thread(cfg) not in _LOOP_ROWS2_LANES
                              or cfg.chunk > _LOOP_ROWS2_MAX_CHUNK
                              or cfg.lookback_width != 1):    # each doubles the registers
            return False
        if cfg.lookback == "chained" and not problem.deterministic:
            return False
        if cfg.stages > 1 and (cfg.chunk < _STAGED_MIN_CHUNK
                               or lanes_per_thread(cfg) > _STAGED_MAX_LANES
                               or staged_bytes(problem, cfg) > _MAX_STAGED_BYTES):
            return False
    else:
        if cfg.rows != 1 or cfg.stages != 1:
            return False
        tile_elems = cfg.chunk * cfg.block_m
        if (cfg.block_m > _MAX_TILE_BLOCK_M or tile_elems > _MAX_TILE
                or tile_elems > _MAX_PER_THREAD * 32 * cfg.num_warps):
            return False
        if tile_elems < 32 * cfg.num_warps:
            return False
    if cfg.window > 1 and (cfg.lookback == "decoupled"
                           or cfg.window >= n_chunks(problem.L, cfg.chunk * cfg.sub)):
        return False
    if cfg.lookback_width > 1 and (
            cfg.lookback == "chained"
            or n_chunks(problem.L, cfg.chunk * cfg.sub) - 1 <= _WIDTH_BELOW[cfg.lookback_width]
            or cfg.lookback_width * max(1, lanes_per_thread(cfg))
            > _MAX_WIDTH_LANES):
        return False
    return not (problem.deterministic and cfg.lookback == "decoupled")


def default(problem: ScanProblem) -> LookbackConfig:
    """The fastest configs on the H200 in GPU time (docs/performance.md): for M >= 128 and
    L >= 64 the software-pipelined loop walk over 64-step chunks at 2 warps, 6 stages: 256
    modes (4 lanes per thread) where M >= 256 (20-25% faster than unstaged 32-step chunks at
    (8, 8192, 1024)), two rows per step (the tuned pick at every such grid shape up to M =
    512 tuned on an H100 and in the H200 table, 3-16% faster than one row on the H100; above
    M = 512 the fastest timed forward at (12, 3000, 700) and (1, 7000, 1000) on an H100 and the
    H200, and train where M is not a multiple of 8, while the H200 table's train picks at M =
    1024 walk one row, so aligned training above 512 takes one; a forward of B M >= 8192
    from M = 512: :func:`_wide_forward`); one row from 256 chunks on, decoupled (at (4,
    16384, 256) one row with 6 stages ran within 1.3% of the exhaustive best both ways on the
    H200 and 0.5% of the fastest timed on an H100, two rows 1.08-1.13x); or, for narrow problems
    (``ScanProblem.narrow``: from M = 96, decoupled), 128 modes one row per step with a
    look-back width of 8 (the tuned pick at (1, 16384, 256) and (2, 65536, 128) in the H200
    table, the fastest timed on an H100 at (2, 20000, 96), (2, 32768, 128) and (1, 100000,
    96), 1.09-1.67x faster than the two-row walk or the tile scan; at 16-110 chunks, or B M
    >= 800, width 1 won).  Up to M = 512, 256 modes only where 128-mode tiles would cover no
    fewer (M = 300: three tiles of 128, 384 modes, not two of 256, 512), and unstaged where M
    is not a multiple of 8 (rows not loaded as 16-byte vectors, which the pipeline stages: at
    (3, 5000, 300) on the H200, 128 modes two rows unstaged ran 1.09x / 1.00x the exhaustive
    best forward / train, the staged 256-mode config 1.33x / 1.44x); an unstaged forward walks
    32-step chunks at 2 lanes per thread (the tuned picks on an H100 at (3, 5000, 300), 0.0513
    ms against 0.0552 for 64-step chunks, and at (12, 3000, 700), 256 modes at 4 warps:
    0.164 against 0.170; there 4 lanes per thread ran 0.171).  Shorter L: 32-step
    loop chunks of up to 512 modes (unstaged: a 32-step walk is mostly pipeline prologue).
    Narrower M: the tile scan, 128-step chunks of 32 modes at 4 warps, shrunk to fit small
    problems.  Under deterministic mode chained, with a window of 8 chunks when there are
    more."""
    mode = "chained" if problem.deterministic else "decoupled"
    narrow = problem.narrow() and not problem.deterministic
    if (problem.M >= 128 or narrow) and problem.L >= 64:
        if _wide_forward(problem):
            cfg = LookbackConfig(chunk=64, block_m=512, num_warps=4, inner="loop", rows=2,
                                 stages=4, lookback=mode)
            if valid(problem, cfg):
                return cfg
        block_m = 256 if problem.M >= 256 and not narrow and (problem.M > 512 or padded_modes(
            problem.M, 256) == padded_modes(problem.M, 128)) else 128
        # (rows, look-back width), the first valid one
        one_row = ((problem.M > 512 and problem.backward and problem.M % 8 == 0)
                   or (problem.L >= ScanProblem.NARROW_MIN_L and not problem.deterministic))
        steps = (((1, 8),) if narrow else ()) + (((1, 1), (2, 1)) if one_row
                                                  else ((2, 1), (1, 1)))
        # an unstaged forward (M not a multiple of 8): 32-step chunks, 2 lanes per thread
        unstaged_fwd = (problem.M % 8 and not problem.backward and not narrow
                        and not problem.deterministic)    # measured decoupled only
        chunk, num_warps = (32, block_m // 64) if unstaged_fwd else (64, 2)
        for rows, width in steps:
            cfg = LookbackConfig(chunk=chunk, block_m=block_m, num_warps=num_warps, inner="loop",
                                 rows=rows, lookback_width=width,
                                 stages=6 if problem.M % 8 == 0 else 1, lookback=mode,
                                 window=8 if mode == "chained" and n_chunks(problem.L, chunk) > 8
                                 else 1)
            if valid(problem, cfg):
                return cfg
    if problem.M >= 128 and problem.L >= 32:
        block_m = 512 if problem.M >= 512 else 256 if problem.M >= 256 else 128
        cfg = LookbackConfig(chunk=32, block_m=block_m, num_warps=4 if block_m >= 256 else 2,
                             inner="loop", lookback=mode,
                             window=8 if mode == "chained" and n_chunks(problem.L, 32) > 8
                             else 1)
        if valid(problem, cfg):
            return cfg
    chunk, block_m, num_warps = 128, 32, 4
    while chunk > 16 and chunk > problem.L:
        chunk //= 2
    while block_m > 16 and block_m > problem.M:
        block_m //= 2
    while num_warps > 2 and chunk * block_m < 32 * 8 * num_warps:
        num_warps //= 2
    window = 8 if mode == "chained" and n_chunks(problem.L, chunk) > 8 else 1
    return LookbackConfig(chunk=chunk, block_m=block_m, num_warps=num_warps, lookback=mode,
                          window=window)


def _wide_forward(problem: ScanProblem) -> bool:
    """A forward with many rows of wide modes (M >= 512 a multiple of 8, B M >= 8192,
    decoupled): 512 modes at 4 warps, two rows, 4 stages is the fastest there (the H200
    table's forward picks at (8, 8192, 1024) and (16, 1024, 1024), the exhaustive best at
    (16, 2048, 512) on the H200 and the fastest timed there on an H100, where 256 modes at 2
    warps, 6 stages ran 1.13x); at B M <= 2048 256 modes won (H200 table (4, 4096, 512), H100
    (1, 7000, 1000): by 2-4%)."""
    return (not problem.backward and not problem.deterministic and problem.M >= 512
            and problem.M % 8 == 0 and problem.B * problem.M >= 8192)


def padded_modes(M: int, block_m: int) -> int:
    """The modes ``block_m``-wide tiles cover (M rounded up)."""
    return n_mode_tiles(M, block_m) * block_m


def n_mode_tiles(M: int, block_m: int) -> int:
    return intmath.cdiv(M, block_m)


def n_chunks(L: int, chunk: int) -> int:
    return intmath.cdiv(L, chunk)
