"""Strategy ``hierarchical``: ``chunk`` with a log-depth prefix over chunk maps.

The prefix program walks blocks of ``prefix_block`` chunk maps, each block prefixed by a
log-depth ``tl.associative_scan`` (Hillis-Steele) instead of one chunk at a time: fewer
dependent steps when there are many chunks per row.
"""
from __future__ import annotations

from typing import Literal

from samu_tune import intmath
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import chunk_family as common
from samu_tune.ops.scan.strategies.chunk_family import ChunkFamilyConfig


class HierarchicalConfig(ChunkFamilyConfig):
    """The ``chunk`` fields plus ``prefix_block``: chunk maps per log-depth prefix block."""

    prefix_block: Literal[16, 64] = 16


def valid(problem: ScanProblem, cfg: HierarchicalConfig) -> bool:
    """The chunk rules; no prefix block far beyond the number of chunks or too big for
    registers."""
    nc = common.n_chunks(problem.L, cfg.chunk)
    return (common.valid_common(problem, cfg)
            and common.prefix_tile_ok(cfg.prefix_block, cfg.block_m)
            and cfg.prefix_block <= max(16, intmath.next_power_of_2(nc)))


def default(problem: ScanProblem) -> HierarchicalConfig:
    return HierarchicalConfig(**common.default_common(problem), prefix_block=16)


STRATEGY = common.register_member(
    "hierarchical",
    description="chunk, with a blocked log-depth (associative-scan) prefix over chunk maps",
    config_model=HierarchicalConfig,
    valid=valid,
    default=default,
    priority=7,
    module=__name__,
)
