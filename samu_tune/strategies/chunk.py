"""Strategy ``chunk``: chunk summaries -> flat serial prefix over chunks -> parallel replay.

Each (row, chunk, mode tile) scans its [CHUNK, BLOCK_M] tile in parallel twice (summary and
replay); only the prefix over the B x n_chunks chunk maps is serial.  See
:mod:`samu_tune.strategies._chunk_common` for the stages and the backward.
"""
from __future__ import annotations

import sys

from pydantic import BaseModel, ConfigDict

from ..problem import ScanProblem
from ..registry import Capability, Strategy, register
from ..tensors import ScanInputs, ScanOutput
from . import _chunk_common as common
from ._chunk_common import BlockM, Chunk, ChunkPlan, Intra, Reduce, Stages, Warps


class ChunkConfig(BaseModel):
    """``chunk``: time steps per tile; ``block_m``: modes per tile; ``num_warps``: warps of the
    tile programs; ``reduce``: backward control/spectrum gradients as per-program partials
    summed by torch (deterministic) or float atomics; ``intra``: each chunk by an associative
    scan of its [chunk, block_m] tile, or by a rolled walk of its steps on a [block_m] vector;
    ``num_stages``: software pipelining depth of the walk (1 for the scan)."""

    model_config = ConfigDict(frozen=True)

    chunk: Chunk = 32
    block_m: BlockM = 32
    num_warps: Warps = 4
    reduce: Reduce = "partials"
    intra: Intra = "scan"
    num_stages: Stages = 1


def valid(problem: ScanProblem, cfg: ChunkConfig) -> bool:
    return common.valid_common(problem, cfg)


def default(problem: ScanProblem) -> ChunkConfig:
    return ChunkConfig(**common.default_common(problem))


def workspace_bytes(problem: ScanProblem, cfg: ChunkConfig) -> int:
    return common.workspace_bytes_common(problem, cfg, "serial")


def run(inputs: ScanInputs, cfg: ChunkConfig) -> ScanOutput:
    return common.chunk_scan(inputs, ChunkPlan.of(cfg, "serial"))


STRATEGY = register(Strategy(
    name="chunk",
    description="chunk maps by in-tile scans -> serial prefix over chunks -> parallel replay",
    capability=Capability(),
    run=run,
    config_model=ChunkConfig,
    valid=valid,
    default=default,
    workspace_bytes=workspace_bytes,
    priority=9,
    modules=(sys.modules[__name__], common, *common.KERNEL_MODULES),
))
