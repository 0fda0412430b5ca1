"""Strategy ``hierarchical``: ``chunk`` with a log-depth prefix over chunk maps.

The prefix program walks blocks of ``prefix_block`` chunk maps, each block prefixed by a
log-depth ``tl.associative_scan`` (Hillis-Steele) instead of one chunk at a time: fewer
dependent steps when there are many chunks per row.
"""
from __future__ import annotations

import sys
from typing import Literal

import triton
from pydantic import BaseModel, ConfigDict

from ..problem import ScanProblem
from ..registry import Capability, Strategy, register
from ..tensors import ScanInputs, ScanOutput
from . import _chunk_common as common
from ._chunk_common import BlockM, Chunk, ChunkPlan, Intra, Reduce, Stages, Warps


class HierarchicalConfig(BaseModel):
    """The ``chunk`` fields plus ``prefix_block``: chunk maps per log-depth prefix block."""

    model_config = ConfigDict(frozen=True)

    chunk: Chunk = 32
    block_m: BlockM = 32
    num_warps: Warps = 4
    reduce: Reduce = "partials"
    intra: Intra = "scan"
    num_stages: Stages = 1
    prefix_block: Literal[16, 64] = 16


def valid(problem: ScanProblem, cfg: HierarchicalConfig) -> bool:
    """The chunk rules; no prefix block far beyond the number of chunks or too big for
    registers."""
    nc = common.n_chunks(problem.L, cfg.chunk)
    return (common.valid_common(problem, cfg)
            and common.prefix_tile_ok(cfg.prefix_block, cfg.block_m)
            and cfg.prefix_block <= max(16, triton.next_power_of_2(nc)))


def default(problem: ScanProblem) -> HierarchicalConfig:
    return HierarchicalConfig(**common.default_common(problem), prefix_block=16)


def workspace_bytes(problem: ScanProblem, cfg: HierarchicalConfig) -> int:
    return common.workspace_bytes_common(problem, cfg, "hierarchical")


def run(inputs: ScanInputs, cfg: HierarchicalConfig) -> ScanOutput:
    return common.chunk_scan(inputs, ChunkPlan.of(cfg, "hierarchical", cfg.prefix_block))


STRATEGY = register(Strategy(
    name="hierarchical",
    description="chunk, with a blocked log-depth (associative-scan) prefix over chunk maps",
    capability=Capability(),
    run=run,
    config_model=HierarchicalConfig,
    valid=valid,
    default=default,
    workspace_bytes=workspace_bytes,
    priority=7,
    modules=(sys.modules[__name__], common, *common.KERNEL_MODULES),
))
