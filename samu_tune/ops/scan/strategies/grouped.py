"""Strategy ``grouped``: ``chunk`` with a three-level prefix over chunk maps.

Chunk maps are grouped ``group`` at a time: (1) every group's composed map, in parallel;
(2) a serial prefix over the groups -> each group's carry-in; (3) every chunk's carry-in
from its group's, in parallel.  The serial part shrinks from n_chunks to n_chunks / group
steps, at the price of two more (parallel) launches.
"""
from __future__ import annotations

from typing import Literal

from samu_tune import intmath
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import chunk_family as common
from samu_tune.ops.scan.strategies.chunk_family import ChunkFamilyConfig


class GroupedConfig(ChunkFamilyConfig):
    """The ``chunk`` fields plus ``group``: chunk maps per group of the three-level prefix."""

    group: Literal[4, 16, 64] = 4


def valid(problem: ScanProblem, cfg: GroupedConfig) -> bool:
    """The chunk rules; groups small enough that there are at least two (the smallest group
    is always allowed) and whose [group, block_m] block fits in registers."""
    nc = common.n_chunks(problem.L, cfg.chunk)
    return (common.valid_common(problem, cfg)
            and common.prefix_tile_ok(cfg.group, cfg.block_m)
            and cfg.group <= max(4, intmath.next_power_of_2(nc) // 2))


def default(problem: ScanProblem) -> GroupedConfig:
    cfg = common.default_common(problem)
    nc = common.n_chunks(problem.L, cfg["chunk"])
    return GroupedConfig(**cfg, group=16 if nc >= 64 else 4)


STRATEGY = common.register_member(
    "grouped",
    description="chunk, with a grouped three-level prefix (group maps, group prefix, expand)",
    config_model=GroupedConfig,
    valid=valid,
    default=default,
    priority=8,
    module=__name__,
)
