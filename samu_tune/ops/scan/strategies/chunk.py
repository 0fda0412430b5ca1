"""Strategy ``chunk``: chunk summaries -> flat serial prefix over chunks -> parallel replay.

Each (row, chunk, mode tile) scans its [CHUNK, BLOCK_M] tile in parallel twice (summary and
replay); only the prefix over the B x n_chunks chunk maps is serial.  See
:mod:`samu_tune.ops.scan.strategies.chunk_family` for the stages and the backward.
"""
from __future__ import annotations

from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.ops.scan.strategies import chunk_family as common
from samu_tune.ops.scan.strategies.chunk_family import ChunkFamilyConfig


class ChunkConfig(ChunkFamilyConfig):
    """The chunk-family fields (see :class:`~.chunk_family.ChunkFamilyConfig`)."""


def valid(problem: ScanProblem, cfg: ChunkConfig) -> bool:
    return common.valid_common(problem, cfg)


def default(problem: ScanProblem) -> ChunkConfig:
    return ChunkConfig(**common.default_common(problem))


STRATEGY = common.register_member(
    "chunk",
    description="chunk maps by in-tile scans -> serial prefix over chunks -> parallel replay",
    config_model=ChunkConfig,
    valid=valid,
    default=default,
    priority=9,
    module=__name__,
)
