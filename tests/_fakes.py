"""Fake strategies with known costs, a fake clock, and an isolated registry/cache for the
tuner, cache and dispatch tests.

A fake wraps the torch reference (so its outputs and gradients are right) and costs a known
time per forward call: it advances :class:`FakeClock` (exact, instant) or really sleeps.
"""
from __future__ import annotations

import time
from typing import Callable, Literal, Optional, Union

import pytest
from pydantic import BaseModel, ConfigDict

from samu_tune import cache, dispatch, registry, settings, timing
from samu_tune.ops.scan.capability import Capability
from samu_tune.registry import EmptyConfig, Strategy
from samu_tune.ops.scan.strategies import reference as reference_strategy
from samu_tune.ops.scan.tensors import ScanOutput


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += ms / 1e3


CLOCK: Optional[FakeClock] = None


class GridConfig(BaseModel):
    """Two fields: a 4 x 3 config space."""

    model_config = ConfigDict(frozen=True)
    a: Literal[0, 1, 2, 3] = 0
    b: Literal[0, 1, 2] = 0


def grid_cost(cfg: GridConfig) -> float:
    """Separable, optimum 1.0 ms at a=2, b=1; the default (0, 0) costs 3.5 ms."""
    return 1.0 + abs(cfg.a - 2) + 0.5 * abs(cfg.b - 1)


class Grid3Config(BaseModel):
    """Three fields: a 4 x 3 x 3 config space."""

    model_config = ConfigDict(frozen=True)
    a: Literal[0, 1, 2, 3] = 0
    b: Literal[0, 1, 2] = 0
    c: Literal[0, 1, 2] = 0


def grid3_cost(cfg: Grid3Config) -> float:
    """Separable, optimum 1.0 ms at a=2, b=1, c=1; the default (0, 0, 0) costs 4.0 ms."""
    return 1.0 + abs(cfg.a - 2) + 0.5 * abs(cfg.b - 1) + 0.5 * abs(cfg.c - 1)


def coupled_cost(cfg: GridConfig) -> float:
    """Not separable: 1.0 ms only at a=3, b=2 together; elsewhere the default (0, 0) is the
    best, so one field at a time never leaves it."""
    return 1.0 if (cfg.a, cfg.b) == (3, 2) else 2.0 + 0.1 * (cfg.a + cfg.b)


def fake(name: str, cost: Union[float, Callable[[BaseModel], float]] = 1.0, *,
         config_model: type[BaseModel] = EmptyConfig, sleep: bool = False,
         wrong: bool = False, raises: Optional[Callable[[], BaseException]] = None,
         raises_if: Optional[Callable[[object], bool]] = None, deterministic: bool = True,
         priority: int = 0, valid=None, default=None, calls: Optional[list] = None,
         trivial: bool = False, **cap) -> Strategy:
    """A strategy costing ``cost`` ms per call (a number or ``cost(cfg)``)."""
    cost_fn = cost if callable(cost) else (lambda cfg, c=cost: c)

    def run(inputs, cfg):
        if calls is not None:
            calls.append((name, cfg))
        if trivial:
            return ScanOutput(inputs.br, inputs.bi)
        if raises is not None and (raises_if is None or raises_if(inputs)):
            raise raises()
        ms = cost_fn(cfg)
        if sleep:
            time.sleep(ms / 1e3)
        elif CLOCK is not None:
            CLOCK.advance(ms)
        out = reference_strategy.run(inputs, cfg)
        if wrong:
            return ScanOutput(out.real * 1.5, out.imag, out.final_state)
        return out

    capability = Capability(devices=frozenset({"cpu", "cuda"}), triton=False,
                            deterministic=deterministic, **cap)
    return Strategy(name=name, description=f"fake {name}", capability=capability, run=run,
                    config_model=config_model, valid=valid, default=default,
                    priority=priority)


class Env:
    """An isolated registry (reference + the fakes added) and a private cache dir."""

    def __init__(self, monkeypatch, tmp_path):
        self.monkeypatch = monkeypatch
        self.tmp_path = tmp_path
        registry.all_strategies()  # import the built-ins before swapping the registry
        self.registry = {"reference": registry.get("reference")}
        monkeypatch.setattr(registry, "_REGISTRY", self.registry)
        self.cache_dir = tmp_path / "cache"
        self.set_env(SAMU_TUNE_CACHE_DIR=str(self.cache_dir))
        monkeypatch.setattr(cache, "DEFAULTS_DIR", tmp_path / "defaults")

    def add(self, *strategies: Strategy) -> None:
        for s in strategies:
            registry.register(s)

    def set_env(self, **env) -> None:
        for k, v in env.items():
            self.monkeypatch.setenv(k, v)
        settings.reload_settings()
        cache.invalidate()
        dispatch.clear_memo()


@pytest.fixture
def env(monkeypatch, tmp_path):
    e = Env(monkeypatch, tmp_path)
    yield e
    monkeypatch.undo()
    settings.reload_settings()
    cache.invalidate()
    dispatch.clear_memo()


@pytest.fixture
def clock(monkeypatch):
    global CLOCK
    CLOCK = FakeClock()
    monkeypatch.setattr(timing, "now", CLOCK)
    yield CLOCK
    CLOCK = None
